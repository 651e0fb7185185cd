"""Developer tools behind ``gpurec tools ...``: the collection plan, the extraction snapshot,
per-operation counter features and the validation log of the collected networks."""
