"""Router kinds: one module per kind (``identity``, ``mean``, ``linear``, ``same_head``,
``per_dim``), the shared base and registry (``base``), and what the buffered kinds share
(``buffered``). A router declares its kind (``kind = LINEAR``); the router module imports the
kinds it uses, which registers them. What a new kind implements: ``base``'s docstring."""
