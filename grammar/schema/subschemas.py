"""Where a schema holds sub-schemas: the keywords every walk over a schema's tree descends through."""

# Where a schema holds sub-schemas, in any draft (values such as enum or const are never walked).
SUB_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SUB_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SUB_ONE = (
    "additionalProperties",
    "items",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "unevaluatedItems",
    "unevaluatedProperties",
)
