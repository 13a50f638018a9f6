"""The control plane: control state in Redis, its HTTP API and guard, the coordinator's side, Prometheus metrics."""
