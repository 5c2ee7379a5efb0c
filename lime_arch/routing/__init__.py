"""How routed K/V are computed: ``kinds`` (one module per router kind: what its weights are, its
mixer, its decoding and compile behaviour; what a new kind implements is in ``kinds.base``),
``mixers`` (the buffer mixer of the buffered kinds and the paper's concatenation; the design in
its docstring), ``plan`` (buffer layout, layer blocks, per-layer plans and their memory traffic),
``state`` (the per-pass buffer and the autograd functions), ``pool`` (reused CPU buffers) and
``ops`` (the buffer mixer as opaque custom ops, which torch.compile runs).
docs/ARCHITECTURE.md, "Routing internals", gives the overview."""
