"""Settings and error types shared by every part of the service."""
