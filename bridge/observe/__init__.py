"""Observability: metrics, health endpoints, systemd notify."""
