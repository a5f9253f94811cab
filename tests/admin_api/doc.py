"""The key API's OpenAPI document, src/admin/openapi.json, checked on its own: valid OpenAPI
3.1, patterns that compile and say what the listener accepts, examples that match their
schemas, links that name real operations. Used by tests/admin_api/run.py."""
import json
import os
import re

import jsonschema
import openapi_spec_validator

from harness import expect, expect_eq  # tests/harness.py, on the path run.py sets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_PATH = os.path.join(ROOT, "src", "admin", "openapi.json")


def load_doc():
    with open(DOC_PATH, "rb") as f:
        raw = f.read()
    return raw, json.loads(raw)


def validator_for(doc, ref):
    """A JSON Schema 2020-12 validator (OpenAPI 3.1's dialect) for `ref` inside `doc`."""
    schema = {"$ref": ref, "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def validate_against(doc, ref, value, what):
    errors = sorted(validator_for(doc, ref).iter_errors(value), key=lambda e: list(e.absolute_path))
    expect(not errors, f"{what} does not match {ref}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:5]))


def walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, path + (i,))


def leaves(doc):
    """{"a/b/0": value} for every scalar in a JSON document."""
    return {"/".join(map(str, p)): v for p, v in walk(doc) if not isinstance(v, (dict, list))}


def doc_checks(res):
    raw, doc = load_doc()

    def spec_valid():
        openapi_spec_validator.validate(doc)
        expect_eq(doc.get("openapi"), "3.1.0", "openapi version")
        return f"openapi-spec-validator {openapi_spec_validator.__version__}"
    res.check("[doc] src/admin/openapi.json is a valid OpenAPI 3.1 document (openapi-spec-validator)", spec_valid)

    def operations():
        ops = sorted(f"{m.upper()} {p}" for p, item in doc["paths"].items() for m in item
                     if m in ("get", "put", "post", "delete", "patch", "head", "options", "trace"))
        expect_eq(ops, ["DELETE /v1/keys/{id}", "GET /openapi.json", "GET /v1/keys", "GET /v1/owners/{sub}/budget",
                        "GET /v1/owners/{sub}/team", "GET /v1/teams/{team}/budget", "GET /v1/usage",
                        "PATCH /v1/keys/{id}", "POST /v1/keys", "PUT /v1/owners/{sub}/budget",
                        "PUT /v1/owners/{sub}/team", "PUT /v1/teams/{team}/budget"],
                  "operations")
        for p, item in doc["paths"].items():
            for m, op in item.items():
                secured = op.get("security") == [{"bearer": []}]
                expect(secured == p.startswith("/v1/"), f"{m} {p}: security {op.get('security')}")
                if p.startswith("/v1/"):
                    expect("401" in op["responses"] and "403" in op["responses"], f"{m} {p}: 401/403 undocumented")
        return ", ".join(ops)
    res.check("[doc] exactly the twelve operations, bearer security on /v1/ only", operations)

    def patterns():
        n = 0
        for path, node in walk(doc):
            if path and path[-1] == "pattern" and isinstance(node, str):
                re.compile(node)  # Python's re reads these ECMA-262 patterns alike (\xHH, classes)
                n += 1
        # The patterns say what the listener accepts: spot-check them.
        schemas = doc["components"]["schemas"]
        scope = re.compile(schemas["Scope"]["pattern"])
        expect(all(scope.search(s) for s in ("infer", "portcullis:admin", "a!#[]~")), "scope pattern refuses a scope")
        expect(not any(scope.search(s) for s in ("a b", 'a"', "a\\b", "é", "")), "scope pattern accepts a non-scope")
        name = re.compile(schemas["KeyName"]["pattern"])
        expect(all(name.search(s) for s in ("ci-bot", " ci bot ✓ ", "x", "\u00a0x")), "name pattern refuses a name")
        expect(not any(name.search(s) for s in ("", " ", "\u3000\u00a0\t", "a\nb", "a\x85b", "a\x7f")),
               "name pattern accepts a blank name or a control character")
        exp = re.compile(schemas["NewKey"]["properties"]["expires_in"]["pattern"])
        expect(all(exp.search(s) for s in ("30s", "15m", "12h", "90d", "999999d", "99999999999s")),
               "expires_in refuses a lifetime")
        expect(not any(exp.search(s) for s in ("0s", "d", "10", "5w", "-5m", "1000000d", " 1d", "007d")),
               "expires_in accepts a bad lifetime")
        group_by = None
        for param in doc["paths"]["/v1/usage"]["get"]["parameters"]:
            if param["name"] == "group_by":
                group_by = re.compile(param["schema"]["pattern"])
        expect(all(group_by.search(s) for s in ("", "day", "model,key", "day,key,service,model", "team,day")),
               "group_by refuses a grouping")
        expect(not any(group_by.search(s) for s in ("user", "day,", ",day", "day,,key", "DAY", " day")),
               "group_by accepts a bad grouping")
        owner = re.compile(doc["paths"]["/v1/owners/{sub}/budget"]["get"]["parameters"][0]["schema"]["pattern"])
        expect(all(owner.search(s) for s in ("alice", "auth0|x/y", "é", "a b")), "the owner pattern refuses an owner")
        expect(not any(owner.search(s) for s in ("", "a\nb", "a\x7f", "a\x85")),
               "the owner pattern accepts a control character")
        return f"{n} patterns"
    res.check("[doc] every pattern compiles and says what the listener accepts", patterns)

    def examples():
        n = 0
        for p, item in doc["paths"].items():
            for m, op in item.items():
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                for ex in (body or {}).get("examples", {}).values():
                    validate_against(doc, body["schema"]["$ref"], ex["value"], f"{m} {p} example")
                    n += 1
        return f"{n} example(s)"
    res.check("[doc] the request examples match their schemas", examples)

    def links():
        op_ids = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
        n = 0
        for _, node in walk(doc):
            if isinstance(node, dict) and "operationId" in node and "parameters" in node and isinstance(node["parameters"], dict):
                target = op_ids.get(node["operationId"])
                expect(target is not None, f"link to unknown operation {node['operationId']}")
                names = {p["name"] for p in target.get("parameters", [])}
                expect(set(node["parameters"]) <= names, f"link parameters {set(node['parameters'])} not in {names}")
                n += 1
        return f"{n} links"
    res.check("[doc] links name existing operations and parameters", links)
    return raw, doc


