"""The controller zoo: its fresh evaluations, results tables and figures (`results`), the references
the configs derive (`references`, `minatar_players`) and Craftax-Classic's own results (`craftax_eval`).
"""
