"""The llguidance backend: grammar texts for each kind of constraint (``text``), the compiled grammar and
matcher (``grammar``), and the bounded search for a short completion that budget mode follows (``search``)."""
