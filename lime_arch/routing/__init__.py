"""How routed K/V are computed: ``mixers`` (one mixer per router kind; the design in its
docstring), ``plan`` (buffer layout, layer blocks, per-layer plans and their memory traffic),
``state`` (the per-pass buffer and the autograd functions) and ``pool`` (reused CPU buffers).
docs/ARCHITECTURE.md, "Routing internals", gives the overview."""
