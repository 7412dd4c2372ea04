"""cloudbox.core: profiles, guests, benchmarks, results, nodes. Never imports Textual."""
