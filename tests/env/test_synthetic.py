"""The synthetic raw catalogue: determinism, schema, WebShop-like statistics, near misses, loadability."""

import json
import re
import statistics
from collections import defaultdict

import pytest

from webshop.catalogue import Catalogue
from webshop.synthetic import generate_raw, generate_raw_json

RAW_ITEM_KEYS = {"asin", "name", "full_description", "small_description", "pricing", "customization_options",
                 "images", "category", "query", "product_category"}


@pytest.fixture(scope="module")
def raw():
    return generate_raw()


def test_same_seed_gives_identical_bytes_and_other_seeds_differ():
    assert generate_raw_json(300, seed=3) == generate_raw_json(300, seed=3)
    assert generate_raw_json(300, seed=3) != generate_raw_json(300, seed=4)


def test_raw_schema_and_size(raw):
    items = raw["items"]
    assert len(items) == 1200
    assert len({p["asin"] for p in items}) == 1200
    assert all(set(p) == RAW_ITEM_KEYS for p in items)
    assert all(re.fullmatch(r"B0[A-Z0-9]{8}", p["asin"]) for p in items)
    assert all(re.fullmatch(r"(\$\d+\.\d\d){1,2}", p["pricing"]) for p in items)
    assert len({p["query"] for p in items}) >= 10
    assert {p["category"] for p in items} == {"fashion", "beauty", "grocery", "electronics", "garden"}
    assert all(p["product_category"].count(" › ") >= 2 for p in items)
    for p in items:
        for values in (p["customization_options"] or {}).values():
            assert values and all(set(v) == {"value", "image"} for v in values)
    assert set(raw["attributes"]) == {p["asin"] for p in items}


def test_statistics_resemble_the_real_catalogue(raw):
    items, attributes = raw["items"], raw["attributes"]
    assert 12 <= statistics.mean(len(p["name"].split()) for p in items) <= 22
    assert all(3 <= len(p["small_description"]) <= 6 for p in items)
    assert 0.05 <= sum(p["pricing"].count("$") == 2 for p in items) / len(items) <= 0.2
    assert 0.4 <= sum(bool(p["customization_options"]) for p in items) / len(items) <= 0.65
    instructed = [a for a in attributes.values() if "instruction" in a]
    assert 0.4 <= len(instructed) / len(items) <= 0.6
    openers = ("i am looking for", "im looking for", "i would like", "i need", "i want", "find me", "get me",
               "can you find me", "i am searching for")
    assert all(a["instruction"].startswith(openers) for a in instructed)
    assert all(set(a["instruction_attributes"]) <= set(a["attributes"]) for a in instructed)
    assert all(all(attr in a["instruction"] for attr in a["instruction_attributes"]) for a in instructed)


def _families(items: list[dict]) -> list[list[dict]]:
    """Runs of consecutive products with the same query and title stem (brand, adjective, noun)."""
    families = []
    for p in items:
        key = (p["query"], p["name"].split(",")[0])
        if families and (families[-1][0]["query"], families[-1][0]["name"].split(",")[0]) == key:
            families[-1].append(p)
        else:
            families.append([p])
    return families


def test_near_misses_share_title_words_but_differ_in_attribute_options_or_price(raw):
    kinds = defaultdict(int)
    for group in _families(raw["items"]):
        first, *others = group
        for other in others:
            if raw["attributes"][other["asin"]]["attributes"] != raw["attributes"][first["asin"]]["attributes"]:
                kinds["attribute"] += 1
            if other["customization_options"] != first["customization_options"]:
                kinds["options"] += 1
            if other["pricing"] != first["pricing"]:
                kinds["price"] += 1
    assert all(kinds[k] >= 50 for k in ("attribute", "options", "price")), kinds


def test_instruction_names_the_attribute_that_sets_a_near_miss_apart(raw):
    """An instructed product whose family has a sibling differing by attributes asks for one the sibling lacks."""
    attributes = raw["attributes"]
    checked = 0
    for group in _families(raw["items"]):
        anchor, *near_misses = (p["asin"] for p in group)
        for asin in near_misses:
            entry = attributes[asin]
            missing_in_anchor = set(entry["attributes"]) - set(attributes[anchor]["attributes"])
            if "instruction" in entry and missing_in_anchor:
                assert missing_in_anchor & set(entry["instruction_attributes"])
                checked += 1
    assert checked >= 20


def test_loads_through_the_catalogue_loader_with_goals(raw):
    catalogue = Catalogue.from_raw(json.loads(json.dumps(raw)), "synthetic")
    assert len(catalogue.products) == 1200
    assert len(catalogue.goals) > 1000
    assert all(g["instruction_text"].startswith(tuple("icfg")) for g in catalogue.goals)
    human = Catalogue.from_raw(raw, "human")
    assert len(human.goals) == len(raw["human"])
