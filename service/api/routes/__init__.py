"""One router per resource, each mounted under ``/api/v1`` by ``service.api.main``."""
