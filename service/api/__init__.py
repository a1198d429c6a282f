"""HTTP layer: dependencies, one router per resource under ``/api/v1``."""
