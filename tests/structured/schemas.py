"""Extraction tasks with varied schemas (nested objects, arrays, enums, anyOf, $ref, formats, bounds)."""

from __future__ import annotations

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
CONTACT = {
    "type": "object",
    "properties": {"email": {"type": "string", "format": "email"}, "city": {"type": "string", "maxLength": 30}},
    "required": ["email", "city"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "product": {"type": "string", "maxLength": 20},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["product", "quantity"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 4,
        },
        "express": {"type": "boolean"},
    },
    "required": ["items", "express"],
    "additionalProperties": False,
}
SENTIMENT = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["sentiment"],
    "additionalProperties": False,
}
EVENT = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "date": {"type": "string", "format": "date"},
        "start": {"type": "string", "format": "time"},
    },
    "required": ["title", "date"],
    "additionalProperties": False,
}
ID_OR_NAME = {
    "type": "object",
    "properties": {
        "ref": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}]},
        "note": {"type": ["string", "null"], "maxLength": 20},
    },
    "required": ["ref", "note"],
    "additionalProperties": False,
}
ADDRESS_BOOK = {
    "$defs": {
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "zip"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
    "required": ["home"],
    "additionalProperties": False,
}
TAGS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 12}, "maxItems": 5},
        "id": {"type": "string", "format": "uuid"},
    },
    "required": ["tags"],
    "additionalProperties": False,
}
TICKET = {
    "type": "object",
    "properties": {
        "priority": {"type": "integer", "enum": [1, 2, 3]},
        "team": {"const": "support"},
        "summary": {"type": "string", "minLength": 5, "maxLength": 60},
        "link": {"type": "string", "format": "uri"},
    },
    "required": ["priority", "team", "summary"],
    "additionalProperties": False,
}
MEETING = {
    "type": "object",
    "properties": {
        "when": {"type": "string", "format": "date-time"},
        "people": {"type": "array", "items": PERSON, "minItems": 1, "maxItems": 3},
        "room": {"oneOf": [{"type": "integer", "minimum": 100, "maximum": 999}, {"type": "null"}]},
    },
    "required": ["people", "room"],
    "additionalProperties": False,
}

TASKS: list[tuple[str, dict]] = [
    ("Maria Gonzalez is 34 and works as a nurse in Valencia.", PERSON),
    ("Tom Becker, aged 51, drives trucks across Germany.", PERSON),
    ("The new intern, Lena (22), starts on Monday.", PERSON),
    ("Write to aisha.khan@example.net; she lives in Manchester.", CONTACT),
    ("Kenji can be reached at kenji.w@example.jp in Kanazawa.", CONTACT),
    ("Contact: p.dubois@example.fr, Bordeaux office.", CONTACT),
    ("I'd like two baguettes and three croissants, delivered fast please.", ORDER),
    ("Order: 1 laptop stand, no rush.", ORDER),
    ("Send 5 notebooks and 10 pens by express courier.", ORDER),
    ("This product is fantastic, I love it!", SENTIMENT),
    ("Terrible service, the food was cold.", SENTIMENT),
    ("The package arrived on Tuesday.", SENTIMENT),
    ("The board meeting is on 2025-03-14 at 09:30.", EVENT),
    ("Reminder: dentist appointment, 2024-11-02, 16:15.", EVENT),
    ("Launch party on the 1st of June 2026.", EVENT),
    ("Ticket ABC-123 concerns the printer; no further notes.", ID_OR_NAME),
    ("Please look at order 4417, customer says it is urgent.", ID_OR_NAME),
    ("Reference XYZ-900.", ID_OR_NAME),
    ("Home: 12 Baker Street, 10115. Work: 1 Main Road, 20095.", ADDRESS_BOOK),
    ("I live at 5 Elm Lane, zip 90210.", ADDRESS_BOOK),
    ("Ship it to 77 Harbour Road, postcode 01234.", ADDRESS_BOOK),
    ("A calm, bookish librarian who knits and loves crime podcasts.", TAGS),
    ("Energetic trail runner and board-game fan.", TAGS),
    ("Photographer, olive farmer, ferry captain.", TAGS),
    ("The login page crashes for every user, fix it now: https://status.example.com", TICKET),
    ("Minor typo on the pricing page.", TICKET),
    ("Customers cannot reset passwords since the last release.", TICKET),
    ("Meeting with Grace Liu (30) and Samuel Okoro (38) on 2025-05-02T10:00:00Z in room 204.", MEETING),
    ("Lunch with David Cohen, 70, no room booked.", MEETING),
    ("Call with Hannah Schultz (19) tomorrow, room 311.", MEETING),
]


def messages(text: str, schema: dict) -> list[dict]:
    import json

    return [
        {
            "role": "user",
            "content": f"{text}\n\nExtract the information as JSON matching this schema: {json.dumps(schema)}",
        }
    ]
