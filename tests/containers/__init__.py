"""The container test harness: rendered pods run as podman containers (tests only, not the product)."""
