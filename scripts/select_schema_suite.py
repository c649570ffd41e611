"""Select the JSON-Schema-Test-Suite cases for the keywords, drafts and formats the grammar narrows or
rewrites, into tests/grammar/data/suite_extended.jsonl (the suite is MIT-licensed; its LICENSE is copied
beside the data). Usage: python scripts/select_schema_suite.py PATH-TO-A-CHECKOUT-OF-THE-SUITE

Each line: id, draft, schema, data, valid, source, description. Cases that need a remote reference
(localhost:1234) or the vocabulary machinery are left out: nothing is fetched, by design.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "grammar" / "data"
SELECTION = {
    "draft2020-12": [
        "not",
        "if-then-else",
        "dependentRequired",
        "dependentSchemas",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "multipleOf",
        "patternProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "oneOf",
        "anchor",
        "defs",
        "boolean_schema",
        "ref",
        "optional/format/hostname",
        "optional/format/duration",
        "optional/format/uri-reference",
        "optional/format/json-pointer",
        "optional/format/relative-json-pointer",
        "optional/format/uri-template",
        "optional/format/iri",
        "optional/format/iri-reference",
        "optional/format/idn-email",
        "optional/format/idn-hostname",
        "optional/format/regex",
        "optional/format/ipv4",
        "optional/format/ipv6",
        "optional/format/unknown",
    ],
    "draft2019-09": ["items", "additionalItems", "dependentRequired", "recursiveRef"],
    "draft7": ["items", "additionalItems", "dependencies", "contains", "const", "propertyNames", "if-then-else", "ref"],
    "draft6": ["items", "additionalItems", "dependencies", "contains", "const", "propertyNames", "ref"],
    "draft4": ["items", "additionalItems", "dependencies", "maximum", "minimum", "ref", "definitions", "not"],
}
REMOTE = ("localhost:1234", "$vocabulary", "example.com/")
DIALECTS = {  # older drafts' files mostly leave $schema out: it is added, so each schema is read as its draft
    "draft4": "http://json-schema.org/draft-04/schema#",
    "draft6": "http://json-schema.org/draft-06/schema#",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "draft2019-09": "https://json-schema.org/draft/2019-09/schema",
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
}


def main(suite: Path) -> None:
    lines = []
    for draft, names in SELECTION.items():
        for name in names:
            path = suite / "tests" / draft / f"{name}.json"
            for g, group in enumerate(json.loads(path.read_text())):
                text = json.dumps(group["schema"])
                if any(marker in text for marker in REMOTE):
                    continue
                schema = group["schema"]
                if isinstance(schema, dict) and "$schema" not in schema:
                    schema = {"$schema": DIALECTS[draft], **schema}
                for t, test in enumerate(group["tests"]):
                    lines.append(
                        json.dumps(
                            {
                                "id": f"{draft}/{name}/{g}/{t}",
                                "draft": draft,
                                "schema": schema,
                                "data": test["data"],
                                "valid": test["valid"],
                                "source": f"tests/{draft}/{name}.json",
                                "description": f"{group['description']}: {test['description']}",
                            }
                        )
                    )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "suite_extended.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copy(suite / "LICENSE", OUT / "LICENSE-JSON-Schema-Test-Suite")
    print(f"{len(lines)} cases -> {OUT / 'suite_extended.jsonl'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
