"""How routed K/V are computed: ``mixers`` (one mixer per router kind; the design in its
docstring), ``plan`` (buffer layout, layer blocks, per-layer plans and their memory traffic),
``state`` (the per-pass buffer and the autograd functions), ``pool`` (reused CPU buffers) and
``ops`` (the buffer mixer as opaque custom ops, which torch.compile runs).
docs/ARCHITECTURE.md, "Routing internals", gives the overview."""
