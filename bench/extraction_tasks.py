"""Held-out extraction tasks for bench.extraction: a document, a JSON schema, and the values a careful reader
extracts (written by hand for this benchmark). Varied domains; nested objects, arrays, nullable fields (a value
the document does not give is null), dates written out in prose to normalise to YYYY-MM-DD, and numbers given with
their units. `copy` names the string leaves that should be verbatim copies of the document (the ones grounding is
for); the others are normalised (dates) or chosen from an enum."""

from __future__ import annotations

from typing import Any


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


S = {"type": "string"}
NS = {"type": ["string", "null"]}
DATE = {"type": "string", "format": "date"}
NDATE = {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}
INT = {"type": "integer", "minimum": 0, "maximum": 1_000_000}
NUM = {"type": "number", "minimum": 0, "maximum": 10_000_000}
NNUM = {"type": ["number", "null"], "minimum": 0, "maximum": 10_000_000}

TASKS: list[dict[str, Any]] = [
    {
        "id": "invoice",
        "document": "Invoice INV-2291 from Larkspur Supplies, dated March 3rd, 2024. Total due: 1,250.40 EUR.",
        "schema": _obj({"number": S, "vendor": S, "date": DATE, "total": NUM, "currency": {"enum": ["EUR", "USD"]}}),
        "expected": {
            "number": "INV-2291",
            "vendor": "Larkspur Supplies",
            "date": "2024-03-03",
            "total": 1250.40,
            "currency": "EUR",
        },
        "copy": ["/number", "/vendor"],
    },
    {
        "id": "contact",
        "document": "Please reach Maria Okafor at maria.okafor@brightlane.io or call +44 20 7946 0958.",
        "schema": _obj({"name": S, "email": S, "phone": S}),
        "expected": {"name": "Maria Okafor", "email": "maria.okafor@brightlane.io", "phone": "+44 20 7946 0958"},
        "copy": ["/name", "/email", "/phone"],
    },
    {
        "id": "event",
        "document": "The Harbor Jazz Night takes place on July 14, 2025 at Pier 39 Pavilion; doors open at 19:30.",
        "schema": _obj({"title": S, "date": DATE, "venue": S, "doors": S}),
        "expected": {"title": "Harbor Jazz Night", "date": "2025-07-14", "venue": "Pier 39 Pavilion", "doors": "19:30"},
        "copy": ["/title", "/venue", "/doors"],
    },
    {
        "id": "product",
        "document": "The Trailblazer X2 backpack weighs 1.4 kg, holds 32 liters and costs 149 USD.",
        "schema": _obj({"model": S, "weight_kg": NUM, "volume_l": NUM, "price_usd": NUM}),
        "expected": {"model": "Trailblazer X2", "weight_kg": 1.4, "volume_l": 32, "price_usd": 149},
        "copy": ["/model"],
    },
    {
        "id": "appointment",
        "document": "Dr. Anil Verma will see patient Jonas Lind on 2 February 2026 in room 4B.",
        "schema": _obj({"doctor": S, "patient": S, "date": DATE, "room": S}),
        "expected": {"doctor": "Anil Verma", "patient": "Jonas Lind", "date": "2026-02-02", "room": "4B"},
        "copy": ["/doctor", "/patient", "/room"],
    },
    {
        "id": "shipment",
        "document": "Parcel 7741-QX shipped by Northwind Freight weighs 12 kg and goes to Rotterdam; "
        "no delivery date has been given yet.",
        "schema": _obj({"tracking": S, "carrier": S, "weight_kg": NUM, "destination": S, "delivery_date": NDATE}),
        "expected": {
            "tracking": "7741-QX",
            "carrier": "Northwind Freight",
            "weight_kg": 12,
            "destination": "Rotterdam",
            "delivery_date": None,
        },
        "copy": ["/tracking", "/carrier", "/destination"],
    },
    {
        "id": "job",
        "document": "Quillmark is hiring a Senior Data Engineer in Lisbon, salary 68,000 EUR a year, remote two days "
        "a week.",
        "schema": _obj({"company": S, "title": S, "city": S, "salary_eur": INT, "remote_days": INT}),
        "expected": {
            "company": "Quillmark",
            "title": "Senior Data Engineer",
            "city": "Lisbon",
            "salary_eur": 68000,
            "remote_days": 2,
        },
        "copy": ["/company", "/title", "/city"],
    },
    {
        "id": "listing",
        "document": "Flat for rent at 12 Rue Cler, Paris: 54 square meters, 2 bedrooms, 1,890 EUR per month.",
        "schema": _obj({"address": S, "area_m2": NUM, "bedrooms": INT, "rent_eur": NUM}),
        "expected": {"address": "12 Rue Cler, Paris", "area_m2": 54, "bedrooms": 2, "rent_eur": 1890},
        "copy": ["/address"],
    },
    {
        "id": "flight",
        "document": "Booking ref ZK8Q2M: flight LX 1613 from Zurich to Vienna on 5 November 2024, seat 14C, "
        "passenger Elena Brandt.",
        "schema": _obj(
            {"booking": S, "flight": S, "from": S, "to": S, "date": DATE, "passenger": _obj({"name": S, "seat": S})}
        ),
        "expected": {
            "booking": "ZK8Q2M",
            "flight": "LX 1613",
            "from": "Zurich",
            "to": "Vienna",
            "date": "2024-11-05",
            "passenger": {"name": "Elena Brandt", "seat": "14C"},
        },
        "copy": ["/booking", "/flight", "/from", "/to", "/passenger/name", "/passenger/seat"],
    },
    {
        "id": "recipe",
        "document": "Lemon risotto serves 4: 320 g arborio rice, 1 litre stock, 2 lemons, 60 g parmesan.",
        "schema": _obj(
            {
                "dish": S,
                "servings": INT,
                "ingredients": {"type": "array", "items": _obj({"item": S, "amount": S}), "maxItems": 6},
            }
        ),
        "expected": {
            "dish": "Lemon risotto",
            "servings": 4,
            "ingredients": [
                {"item": "arborio rice", "amount": "320 g"},
                {"item": "stock", "amount": "1 litre"},
                {"item": "lemons", "amount": "2"},
                {"item": "parmesan", "amount": "60 g"},
            ],
        },
        "copy": [
            "/dish",
            "/ingredients/0/item",
            "/ingredients/0/amount",
            "/ingredients/1/item",
            "/ingredients/1/amount",
            "/ingredients/3/item",
            "/ingredients/3/amount",
        ],
    },
    {
        "id": "transfer",
        "document": "On 18 April 2024, 2,500.00 GBP were sent from account GB29 NWBK 6016 1331 9268 19 to "
        "Hollis & Park Ltd, reference 'Q1 retainer'.",
        "schema": _obj(
            {
                "date": DATE,
                "amount": NUM,
                "currency": {"enum": ["GBP", "EUR", "USD"]},
                "iban": S,
                "payee": S,
                "reference": S,
            }
        ),
        "expected": {
            "date": "2024-04-18",
            "amount": 2500.0,
            "currency": "GBP",
            "iban": "GB29 NWBK 6016 1331 9268 19",
            "payee": "Hollis & Park Ltd",
            "reference": "Q1 retainer",
        },
        "copy": ["/iban", "/payee", "/reference"],
    },
    {
        "id": "hotel",
        "document": "Reservation for Tomasz Nowak at Hotel Aurelia, check-in 9 August 2025, check-out 12 August 2025, "
        "one double room, breakfast included.",
        "schema": _obj({"guest": S, "hotel": S, "check_in": DATE, "check_out": DATE, "breakfast": {"type": "boolean"}}),
        "expected": {
            "guest": "Tomasz Nowak",
            "hotel": "Hotel Aurelia",
            "check_in": "2025-08-09",
            "check_out": "2025-08-12",
            "breakfast": True,
        },
        "copy": ["/guest", "/hotel"],
    },
    {
        "id": "ticket",
        "document": "Support ticket #58213 opened by Priya Raman: the export to CSV fails with error E-402. "
        "Priority high.",
        "schema": _obj(
            {"ticket": INT, "reporter": S, "error_code": S, "priority": {"enum": ["low", "medium", "high"]}}
        ),
        "expected": {"ticket": 58213, "reporter": "Priya Raman", "error_code": "E-402", "priority": "high"},
        "copy": ["/reporter", "/error_code"],
    },
    {
        "id": "car",
        "document": "For sale: 2019 Skoda Octavia estate, 84,300 km, diesel, asking 13,900 EUR. No accidents.",
        "schema": _obj(
            {
                "make": S,
                "model": S,
                "year": INT,
                "mileage_km": INT,
                "fuel": {"enum": ["petrol", "diesel", "electric", "hybrid"]},
                "price_eur": NUM,
            }
        ),
        "expected": {
            "make": "Skoda",
            "model": "Octavia",
            "year": 2019,
            "mileage_km": 84300,
            "fuel": "diesel",
            "price_eur": 13900,
        },
        "copy": ["/make", "/model"],
    },
    {
        "id": "course",
        "document": "Student Amara Diallo enrolled in Linear Algebra II (MATH 2210), 5 credits, starting "
        "January 13, 2025.",
        "schema": _obj({"student": S, "course": S, "code": S, "credits": INT, "start": DATE}),
        "expected": {
            "student": "Amara Diallo",
            "course": "Linear Algebra II",
            "code": "MATH 2210",
            "credits": 5,
            "start": "2025-01-13",
        },
        "copy": ["/student", "/course", "/code"],
    },
    {
        "id": "claim",
        "document": "Claim CLM-55-0921 filed by Rosa Medina for water damage at her kitchen; estimated cost "
        "3,400 USD. The adjuster has not been assigned.",
        "schema": _obj({"claim": S, "claimant": S, "cause": S, "estimate_usd": NUM, "adjuster": NS}),
        "expected": {
            "claim": "CLM-55-0921",
            "claimant": "Rosa Medina",
            "cause": "water damage",
            "estimate_usd": 3400,
            "adjuster": None,
        },
        "copy": ["/claim", "/claimant", "/cause"],
    },
    {
        "id": "order",
        "document": "Table 7 ordered two margherita pizzas, one caesar salad and three sparkling waters.",
        "schema": _obj(
            {"table": INT, "items": {"type": "array", "items": _obj({"name": S, "qty": INT}), "maxItems": 5}}
        ),
        "expected": {
            "table": 7,
            "items": [
                {"name": "margherita pizzas", "qty": 2},
                {"name": "caesar salad", "qty": 1},
                {"name": "sparkling waters", "qty": 3},
            ],
        },
        "copy": ["/items/0/name", "/items/1/name", "/items/2/name"],
    },
    {
        "id": "talk",
        "document": "At RustConf, Hana Sato presents 'Zero-copy parsing in practice' on September 10, 2024, "
        "a 40-minute talk.",
        "schema": _obj({"conference": S, "speaker": S, "title": S, "date": DATE, "minutes": INT}),
        "expected": {
            "conference": "RustConf",
            "speaker": "Hana Sato",
            "title": "Zero-copy parsing in practice",
            "date": "2024-09-10",
            "minutes": 40,
        },
        "copy": ["/conference", "/speaker", "/title"],
    },
    {
        "id": "lease",
        "document": "Lease between Greywell Properties and Ian McBride for unit 3F, from 1 October 2024 for 12 months, "
        "deposit 2,000 USD.",
        "schema": _obj({"landlord": S, "tenant": S, "unit": S, "start": DATE, "months": INT, "deposit_usd": NUM}),
        "expected": {
            "landlord": "Greywell Properties",
            "tenant": "Ian McBride",
            "unit": "3F",
            "start": "2024-10-01",
            "months": 12,
            "deposit_usd": 2000,
        },
        "copy": ["/landlord", "/tenant", "/unit"],
    },
    {
        "id": "employee",
        "document": "Employee record: Lucas Ferreira, badge E-10442, joined the Logistics department on "
        "June 3, 2021; manager Sofia Reyes.",
        "schema": _obj({"name": S, "badge": S, "department": S, "joined": DATE, "manager": NS}),
        "expected": {
            "name": "Lucas Ferreira",
            "badge": "E-10442",
            "department": "Logistics",
            "joined": "2021-06-03",
            "manager": "Sofia Reyes",
        },
        "copy": ["/name", "/badge", "/department", "/manager"],
    },
    {
        "id": "weather",
        "document": "Bergen, Tuesday: 11 degrees Celsius, rain, wind 28 km/h from the west.",
        "schema": _obj({"city": S, "temperature_c": NUM, "conditions": S, "wind_kmh": NUM, "wind_from": S}),
        "expected": {"city": "Bergen", "temperature_c": 11, "conditions": "rain", "wind_kmh": 28, "wind_from": "west"},
        "copy": ["/city", "/conditions", "/wind_from"],
    },
    {
        "id": "match",
        "document": "Final score: Riverside Rovers 3, Eastgate United 1. Goals for Rovers by Kofi Mensah (2) and "
        "Leo Grant.",
        "schema": _obj(
            {
                "home": _obj({"team": S, "goals": INT}),
                "away": _obj({"team": S, "goals": INT}),
                "scorers": {"type": "array", "items": S, "maxItems": 4},
            }
        ),
        "expected": {
            "home": {"team": "Riverside Rovers", "goals": 3},
            "away": {"team": "Eastgate United", "goals": 1},
            "scorers": ["Kofi Mensah", "Leo Grant"],
        },
        "copy": ["/home/team", "/away/team", "/scorers/0", "/scorers/1"],
    },
    {
        "id": "book",
        "document": "'The Salt Archive' by Ines Carvalho, published by Meridian Press in 2022, 384 pages, "
        "ISBN 978-1-4028-9462-6.",
        "schema": _obj({"title": S, "author": S, "publisher": S, "year": INT, "pages": INT, "isbn": S}),
        "expected": {
            "title": "The Salt Archive",
            "author": "Ines Carvalho",
            "publisher": "Meridian Press",
            "year": 2022,
            "pages": 384,
            "isbn": "978-1-4028-9462-6",
        },
        "copy": ["/title", "/author", "/publisher", "/isbn"],
    },
    {
        "id": "concert",
        "document": "Ticket: Nightglass live at the Olympia Theatre, 22 March 2025, row K seat 18, price 55 EUR.",
        "schema": _obj({"artist": S, "venue": S, "date": DATE, "row": S, "seat": INT, "price_eur": NUM}),
        "expected": {
            "artist": "Nightglass",
            "venue": "Olympia Theatre",
            "date": "2025-03-22",
            "row": "K",
            "seat": 18,
            "price_eur": 55,
        },
        "copy": ["/artist", "/venue", "/row"],
    },
    {
        "id": "prescription",
        "document": "Prescription for Greta Holm: amoxicillin 500 mg, three times a day for 7 days. No refills.",
        "schema": _obj({"patient": S, "drug": S, "dose_mg": NUM, "times_per_day": INT, "days": INT, "refills": INT}),
        "expected": {
            "patient": "Greta Holm",
            "drug": "amoxicillin",
            "dose_mg": 500,
            "times_per_day": 3,
            "days": 7,
            "refills": 0,
        },
        "copy": ["/patient", "/drug"],
    },
    {
        "id": "lab",
        "document": "Lab report for sample S-3317: hemoglobin 13.8 g/dL, glucose 92 mg/dL; cholesterol was "
        "not measured.",
        "schema": _obj({"sample": S, "hemoglobin_g_dl": NNUM, "glucose_mg_dl": NNUM, "cholesterol_mg_dl": NNUM}),
        "expected": {"sample": "S-3317", "hemoglobin_g_dl": 13.8, "glucose_mg_dl": 92, "cholesterol_mg_dl": None},
        "copy": ["/sample"],
    },
    {
        "id": "purchase_order",
        "document": "PO 4410-B for Castellan Tools: 40 units of torque wrench TW-12 at 18.50 USD each, delivery by "
        "May 30, 2024.",
        "schema": _obj(
            {
                "po": S,
                "supplier": S,
                "lines": {
                    "type": "array",
                    "maxItems": 3,
                    "items": _obj({"sku": S, "description": S, "quantity": INT, "unit_price": NUM}),
                },
                "deliver_by": DATE,
            }
        ),
        "expected": {
            "po": "4410-B",
            "supplier": "Castellan Tools",
            "lines": [{"sku": "TW-12", "description": "torque wrench", "quantity": 40, "unit_price": 18.5}],
            "deliver_by": "2024-05-30",
        },
        "copy": ["/po", "/supplier", "/lines/0/sku", "/lines/0/description"],
    },
    {
        "id": "meeting",
        "document": "Meeting on 7 October 2024 with Dana Whitfield and Omar Haddad agreed to move the launch to "
        "November; action: Omar drafts the press note.",
        "schema": _obj(
            {"date": DATE, "attendees": {"type": "array", "items": S, "maxItems": 4}, "decision": S, "action_owner": S}
        ),
        "expected": {
            "date": "2024-10-07",
            "attendees": ["Dana Whitfield", "Omar Haddad"],
            "decision": "move the launch to November",
            "action_owner": "Omar",
        },
        "copy": ["/attendees/0", "/attendees/1", "/decision", "/action_owner"],
    },
    {
        "id": "itinerary",
        "document": "Day 1: train from Milan to Florence (2 h). Day 2: bus from Florence to Siena (75 min).",
        "schema": _obj(
            {
                "legs": {
                    "type": "array",
                    "maxItems": 3,
                    "items": _obj({"day": INT, "mode": {"enum": ["train", "bus", "plane", "car"]}, "from": S, "to": S}),
                }
            }
        ),
        "expected": {
            "legs": [
                {"day": 1, "mode": "train", "from": "Milan", "to": "Florence"},
                {"day": 2, "mode": "bus", "from": "Florence", "to": "Siena"},
            ]
        },
        "copy": ["/legs/0/from", "/legs/0/to", "/legs/1/from", "/legs/1/to"],
    },
    {
        "id": "warranty",
        "document": "Warranty card: Aquaflow dishwasher, serial AQ-88213-D, bought on December 1st, 2023, "
        "covered for 24 months by Brennan Appliances.",
        "schema": _obj({"product": S, "serial": S, "purchased": DATE, "months": INT, "seller": S}),
        "expected": {
            "product": "Aquaflow dishwasher",
            "serial": "AQ-88213-D",
            "purchased": "2023-12-01",
            "months": 24,
            "seller": "Brennan Appliances",
        },
        "copy": ["/product", "/serial", "/seller"],
    },
    {
        "id": "donation",
        "document": "Thank you, Henrik Dahl, for your gift of 150 NOK to the Coastal Birds Trust on 2 May 2025. "
        "Your donor ID is D-77120.",
        "schema": _obj(
            {
                "donor": S,
                "amount": NUM,
                "currency": {"enum": ["NOK", "EUR", "USD"]},
                "charity": S,
                "date": DATE,
                "donor_id": S,
            }
        ),
        "expected": {
            "donor": "Henrik Dahl",
            "amount": 150,
            "currency": "NOK",
            "charity": "Coastal Birds Trust",
            "date": "2025-05-02",
            "donor_id": "D-77120",
        },
        "copy": ["/donor", "/charity", "/donor_id"],
    },
]
