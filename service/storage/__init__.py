"""Persistence: SQLite (sqlite-utils) with one writer, schema migrations, content-addressed blobs."""
