"""The documents the specification is transcribed from, and the papers behind them.

Entries cite a source as ``Source(document, where)``; ``where`` is a section or an
equation number inside that document.
"""

from __future__ import annotations

from dataclasses import dataclass

NOTES = "Notes on the Mathematical Structure of GPT LLM Architectures (Becker-Kahn, arXiv:2410.19370)"
GUIDE = "The Mathematics of Building a Basic Transformer Architecture from Scratch: A Step-by-Step Guide"
BLUEPRINT = "A Mathematical Blueprint for a Generative Pre-trained Transformer"
POST = "Notes on the Mathematics of LLM Architectures (Becker-Kahn, LessWrong post and discussion)"

VASWANI_2017 = "Vaswani et al. 2017, Attention Is All You Need"
RADFORD_2019 = "Radford et al. 2019, Language Models are Unsupervised Multitask Learners (GPT-2)"
BROWN_2020 = "Brown et al. 2020, Language Models are Few-Shot Learners (GPT-3)"
BA_2016 = "Ba, Kiros & Hinton 2016, Layer Normalization"
HENDRYCKS_2016 = "Hendrycks & Gimpel 2016, Gaussian Error Linear Units (GELUs)"
SENNRICH_2016 = "Sennrich, Haddow & Birch 2016, Neural Machine Translation of Rare Words with Subword Units"
LOSHCHILOV_2019 = "Loshchilov & Hutter 2019, Decoupled Weight Decay Regularization"
KINGMA_2015 = "Kingma & Ba 2015, Adam: A Method for Stochastic Optimization"
HOLTZMAN_2020 = "Holtzman et al. 2020, The Curious Case of Neural Text Degeneration"
FAN_2018 = "Fan, Lewis & Dauphin 2018, Hierarchical Neural Story Generation"
HIGHAM_MARY_2019 = "Higham & Mary 2019, A New Approach to Probabilistic Rounding Error Analysis"
KAPLAN_2020 = "Kaplan et al. 2020, Scaling Laws for Neural Language Models"
UNICODE_15 = "The Unicode Standard, Version 15.0 (Unicode Consortium 2022)"
MICIKEVICIUS_2018 = "Micikevicius et al. 2018, Mixed Precision Training"

DOCUMENTS = (NOTES, GUIDE, BLUEPRINT, POST)


@dataclass(frozen=True)
class Source:
    """A citation: a document (or paper) title and where in it."""

    document: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.document}, {self.where}" if self.where else self.document
