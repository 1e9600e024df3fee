"""Pure check logic: observations and expectations in, a CheckResult out. No I/O here."""
