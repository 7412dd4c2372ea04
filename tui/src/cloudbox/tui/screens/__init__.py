"""One module per screen: overview, profiles, guests, tests, results, help."""
