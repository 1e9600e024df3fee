"""ISSUE-37 item 3: hostile values in every schema field, every output loaded by its real consumer."""
