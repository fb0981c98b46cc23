"""Controlled experiments on the Notes' three open questions: the vocabulary size, tied or
untied embeddings, and the head width (``gptspec experiment NAME``).

``studies`` describes the designs, ``corpus`` the data split and its tokenizations,
``worker`` one run (a process of its own), ``runner`` the study (plan, resume, processes,
results), ``metrics`` and ``summary`` the numbers, ``plots`` the figures. The site's "Open
questions" page is generated from the results (``docs/sitegen/open_questions.py``).
"""
