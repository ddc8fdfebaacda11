"""GenRMPool operator: API models, functional core and kopf shell."""
