"""Dataplane side of the precision policy: walks the controlplane's ladder."""
