"""JSON Schema translation: validate and refuse by keyword (``check``), close objects (``strict``), normalise
into single-type alternatives (``normalize``) and write one regex for the compact JSON text (``to_regex``),
with the pieces they share: JSON string text (``json_text``), ECMA patterns (``ecma_pattern``), string
formats (``formats``) and bounded numbers (``numeric``)."""
