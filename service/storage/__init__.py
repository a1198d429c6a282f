"""Persistence: SQLite (sqlite-utils), one writer, schema migrations, content-addressed blobs."""
