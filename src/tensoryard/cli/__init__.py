"""The `tyard` command."""
