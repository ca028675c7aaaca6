"""50 varied JSON schemas for the structured-output tests and `tokenmill bench structured`: (a one-line request for the model, the schema).

Between them: nested objects, arrays with minItems / maxItems, enums and consts, string patterns,
lengths and formats, numbers and integers with ranges (inclusive and exclusive), optional and required
fields, additionalProperties false, $defs / $ref (recursive too), anyOf / oneOf, nulls and booleans, and
top-level values that are not objects. Free strings carry a maxLength, as a real schema for a small model
would (and integers a maximum, decimals a multipleOf (0.25: exact in binary, so the validator agrees), recursion a depth: a 135M model left free writes
1.0000000... until max_tokens): the test is that every output validates, not how far the model counts
before it closes a bracket.
"""

from __future__ import annotations

from typing import Any

S = dict[str, Any]


def _obj(props: S, required: list[str] | None = None, closed: bool = True, extra: S | None = None) -> S:
    schema: S = {"type": "object", "properties": props, "required": list(props) if required is None else required}
    if closed:
        schema["additionalProperties"] = False
    schema.update(extra or {})
    return schema


def _str(n: int = 40, **extra: Any) -> S:
    return {"type": "string", "maxLength": n, **extra}


_ADDRESS = _obj({"street": _str(), "city": _str(30), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})

SCHEMAS: list[tuple[str, S]] = [
    ("a person", _obj({"name": _str(), "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("a book", _obj({"title": _str(60), "author": _str(), "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
                     "isbn": {"type": "string", "pattern": "^97[89][0-9]{10}$"}})),
    ("a city", _obj({"name": _str(), "country": _str(), "population": {"type": "integer", "minimum": 1},
                     "capital": {"type": "boolean"}})),
    ("a colour", {"type": "string", "enum": ["red", "green", "blue", "yellow", "purple"]}),
    ("a score between 0 and 1", {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 1}),
    ("a dice roll", {"type": "integer", "minimum": 1, "maximum": 6}),
    ("a list of three fruits", {"type": "array", "items": _str(20), "minItems": 3, "maxItems": 3}),
    ("a todo list", _obj({"items": {"type": "array", "maxItems": 4, "items": _obj(
        {"task": _str(50), "done": {"type": "boolean"}, "priority": {"enum": ["low", "medium", "high"]}})}})),
    ("a user with an address", _obj({"name": _str(), "address": _ADDRESS})),
    ("an order", _obj({"order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
                       "quantity": {"type": "integer", "exclusiveMinimum": 0, "maximum": 99},
                       "price": {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": 0, "maximum": 10000},
                       "currency": {"const": "EUR"}})),
    ("a point on a plane", _obj({"x": {"type": "number", "multipleOf": 0.25, "minimum": -100, "maximum": 100},
                                 "y": {"type": "number", "multipleOf": 0.25, "minimum": -100, "maximum": 100}})),
    ("a weather report", _obj({"city": _str(), "temperature_c": {"type": "number", "multipleOf": 0.25, "minimum": -60, "maximum": 60},
                               "condition": {"enum": ["sunny", "cloudy", "rain", "snow", "fog"]},
                               "humidity": {"type": "integer", "minimum": 0, "maximum": 100}},
                              required=["city", "temperature_c"])),
    ("a movie with an optional rating", _obj({"title": _str(60), "rating": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 10},
                                              "genres": {"type": "array", "items": _str(15), "maxItems": 3}},
                                             required=["title"])),
    ("a product", _obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "name": _str(),
                        "in_stock": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["new", "sale", "eco"]},
                                                                  "maxItems": 3}})),
    ("a yes or no answer", {"type": "boolean"}),
    ("nothing at all", {"type": "null"}),
    ("an HTTP status", _obj({"code": {"type": "integer", "minimum": 100, "maximum": 599}, "reason": _str(30)})),
    ("a date", _obj({"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}})),
    ("a time of day", _obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                            "minute": {"type": "integer", "minimum": 0, "maximum": 59}})),
    ("an email contact", _obj({"name": _str(), "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"}})),
    ("a category with subcategories", {"$defs": {
        "node": _obj({"name": _str(20), "children": {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/leaf"}}},
                     required=["name"]),
        "leaf": _obj({"name": _str(20)})}, "$ref": "#/$defs/node"}),
    ("a shape", {"oneOf": [_obj({"kind": {"const": "circle"}, "radius": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 50}}),
                           _obj({"kind": {"const": "square"}, "side": {"type": "number", "multipleOf": 0.25, "minimum": 0, "maximum": 50}})]}),
    ("an id that is a number or a string", _obj({"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99999},
                                                                  {"type": "string", "pattern": "^[a-f0-9]{8}$"}]}})),
    ("a nullable nickname", _obj({"name": _str(), "nickname": {"type": ["string", "null"], "maxLength": 20}})),
    ("a matrix of two rows of two numbers", {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9, "maximum": 9}}}),
    ("a team", _obj({"name": _str(), "members": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"$ref": "#/$defs/member"}}},
                    extra={"$defs": {"member": _obj({"name": _str(), "role": {"enum": ["lead", "dev", "qa"]}})}})),
    ("a recipe", _obj({"name": _str(), "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                       "ingredients": {"type": "array", "minItems": 1, "maxItems": 4, "items": _obj(
                           {"item": _str(30), "grams": {"type": "integer", "minimum": 1, "maximum": 2000}})}})),
    ("a percentage", {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}),
    ("a country code", _obj({"code": {"type": "string", "pattern": "^[A-Z]{2}$"}})),
    ("an open object of settings", {"type": "object", "properties": {"theme": {"enum": ["light", "dark"]}},
                                    "required": ["theme"], "maxProperties": 3,
                                    "additionalProperties": {"type": "boolean"}}),
    # keys bounded by a pattern (llguidance has no propertyNames): an unbounded key let a sampled answer spend
    # all of max_tokens inside one key name
    ("a key-value map of counts", {"type": "object", "patternProperties": {
        "^[A-Za-z_]{1,16}$": {"type": "integer", "minimum": 0, "maximum": 10000}},
        "additionalProperties": False, "maxProperties": 3}),
    ("a version string", _obj({"version": {"type": "string", "pattern": "^[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,3}$"}})),
    ("a hex colour", _obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("a rectangle", _obj({"width": {"type": "integer", "minimum": 1, "maximum": 1000},
                          "height": {"type": "integer", "minimum": 1, "maximum": 1000},
                          "unit": {"enum": ["px", "cm", "in"]}}, required=["width", "height"])),
    ("a sentence and its word count", _obj({"sentence": _str(80), "words": {"type": "integer", "minimum": 1, "maximum": 40}})),
    ("a list of up to five even numbers", {"type": "array", "maxItems": 5, "items": {"type": "integer", "multipleOf": 2,
                                                                                      "minimum": 0, "maximum": 100}}),
    ("a flight", _obj({"from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                       "seats": {"type": "integer", "minimum": 1, "maximum": 9}, "class": {"enum": ["economy", "business"]}})),
    ("a bank transfer", _obj({"iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{8,16}$"},
                              "amount": {"type": "number", "multipleOf": 0.25, "minimum": 0.01, "maximum": 5000},
                              "note": _str(30)}, required=["iban", "amount"])),
    ("a log line", _obj({"level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]}, "message": _str(60),
                         "code": {"type": ["integer", "null"], "minimum": 0, "maximum": 999}})),
    ("a pair of a word and a number", {"type": "array", "prefixItems": [_str(20), {"type": "integer", "minimum": 0, "maximum": 9}],
                                       "items": False, "minItems": 2}),
    ("a student with grades", _obj({"name": _str(), "grades": {"type": "array", "minItems": 2, "maxItems": 4, "items": {
        "type": "number", "multipleOf": 0.25, "minimum": 1, "maximum": 6}}, "graduated": {"type": "boolean"}})),
    ("an animal", _obj({"species": {"enum": ["cat", "dog", "bird", "fish"]}, "name": _str(20),
                        "legs": {"type": "integer", "minimum": 0, "maximum": 4}})),
    ("a chess move", _obj({"from": {"type": "string", "pattern": "^[a-h][1-8]$"},
                           "to": {"type": "string", "pattern": "^[a-h][1-8]$"}})),
    ("a file entry", _obj({"path": {"type": "string", "pattern": "^(/[a-z]{1,8}){1,4}$"},
                           "size": {"type": "integer", "minimum": 0, "maximum": 1000000},
                           "kind": {"enum": ["file", "dir"]}})),
    ("a poll", _obj({"question": _str(60), "options": {"type": "array", "minItems": 2, "maxItems": 4, "items": _str(20)},
                     "multiple": {"type": "boolean"}}, required=["question", "options"])),
    ("a greeting", _obj({"greeting": {"type": "string", "minLength": 2, "maxLength": 30}})),
    ("a deeply nested config", _obj({"server": _obj({"http": _obj({"port": {"type": "integer", "minimum": 1024, "maximum": 65535},
                                                                   "tls": {"type": "boolean"}})})})),
    ("a temperature reading that may be missing", {"anyOf": [{"type": "null"},
                                                             _obj({"celsius": {"type": "number", "multipleOf": 0.25, "minimum": -50, "maximum": 50}})]}),
    ("an event", _obj({"name": _str(), "day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                       "attendees": {"type": "array", "items": _obj({"name": _str(20)}), "maxItems": 3},
                       "online": {"type": "boolean"}}, required=["name", "day"])),
    ("a linked list of digits", {"$defs": {
        "cell": _obj({"value": {"type": "integer", "minimum": 0, "maximum": 9},
                      "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/last"}]}}),
        "last": _obj({"value": {"type": "integer", "minimum": 0, "maximum": 9}, "next": {"type": "null"}})},
        "$ref": "#/$defs/cell"}),
]

assert len(SCHEMAS) == 50, len(SCHEMAS)
