"""What is not the product: loadprobe (an operator's probe, no Django), blocking_check (the static
check behind invariant 2) and processes (the starters tests and benchmarks share)."""
