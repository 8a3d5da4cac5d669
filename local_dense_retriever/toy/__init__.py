"""The generated toy world: a seeded corpus of made-up entities, its single- and two-hop questions, and the embedded
default (that corpus encoded with the bundled all-MiniLM-L6-v2, built once and cached).

Data generation only: it may import the service's config, errors, encoder and index builder and the shared leaves; it
never imports the tool, the agent loops or verl.
"""
