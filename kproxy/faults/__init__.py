"""Sans-IO fault rules: YAML models, matchers, schedules and decisions."""
