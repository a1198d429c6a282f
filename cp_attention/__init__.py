"""cp_attention package."""
