"""PagedWeight controlplane: dataplane registry, activity table, sensitivity
profiles, precision planner, and the Telemetry / Admin gRPC services."""
