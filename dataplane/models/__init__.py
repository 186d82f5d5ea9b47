"""Model families as plain nn.Modules, and the table that names them."""
