"""Ray Data stage functions and callable classes (one module per pipeline stage)."""
