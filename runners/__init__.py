"""runners package."""
