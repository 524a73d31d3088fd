"""`tlc.core`: diagnostics, payloads and rule tables; imports nothing of tlc."""
