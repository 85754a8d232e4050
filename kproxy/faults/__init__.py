"""Sans-IO fault rules: YAML models, matchers, schedules and decisions."""

from kproxy.faults.decisions import FORWARD, Decision
from kproxy.faults.engine import FaultEngine, engine_from_rules
from kproxy.faults.errors import Problem, RuleFileError
from kproxy.faults.loader import json_schema, load_rule_file, load_rule_text
from kproxy.faults.model import Rule, RuleFile
from kproxy.faults.view import ExchangeView

__all__ = [
    "FORWARD",
    "Decision",
    "FaultEngine",
    "Problem",
    "ExchangeView",
    "Rule",
    "RuleFile",
    "RuleFileError",
    "engine_from_rules",
    "json_schema",
    "load_rule_file",
    "load_rule_text",
]
