"""Sans-IO transaction tracker: synthetic transaction numbers and hazards."""
