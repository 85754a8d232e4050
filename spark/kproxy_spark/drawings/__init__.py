"""Pictures of the first few cases of each class, for report.html.

* ``anchors``: which cases get a wire sequence diagram, and what each one's
  picture is anchored on (its records, the EndTxns or Fetch it names);
* ``wire_story``: one Spark job over the wire views the checks kept, which
  fetches those exchanges and the records' fates for every drawn case at
  once and stores them in the case (``wire_story``), so report.html can be
  re-rendered from report.json alone;
* ``sequence``: a story as an SVG sequence diagram (client, proxy, broker);
* ``cycle``: a G0 or G1c case as an SVG cycle of operations;
* ``svg``: the few SVG pieces both are made of.
"""
