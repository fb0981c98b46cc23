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
class Reference:
    """Who wrote a cited document, when, and where a reader finds it: ``url`` is empty and
    ``authors`` or ``date`` say "not stated" where the project's copy does not say."""

    authors: str
    date: str
    url: str = ""
    venue: str = ""


_UNSTATED = "not stated in the project's copy"

REFERENCES: dict[str, Reference] = {
    NOTES: Reference("S. Becker-Kahn", "October 2024", "https://arxiv.org/abs/2410.19370",
                     "arXiv:2410.19370"),
    GUIDE: Reference(_UNSTATED, _UNSTATED),
    BLUEPRINT: Reference(_UNSTATED, _UNSTATED),
    POST: Reference("S. Becker-Kahn", _UNSTATED, "", "LessWrong"),
    VASWANI_2017: Reference("Ashish Vaswani, Noam Shazeer, Niki Parmar, Jakob Uszkoreit, Llion "
                            "Jones, Aidan N. Gomez, Łukasz Kaiser, Illia Polosukhin", "2017",
                            "https://arxiv.org/abs/1706.03762", "NeurIPS 2017; arXiv:1706.03762"),
    RADFORD_2019: Reference("Alec Radford, Jeffrey Wu, Rewon Child, David Luan, Dario Amodei, "
                            "Ilya Sutskever", "2019",
                            "https://cdn.openai.com/better-language-models/language_models_are_"
                            "unsupervised_multitask_learners.pdf", "OpenAI technical report"),
    BROWN_2020: Reference("Tom B. Brown et al. (31 authors)", "2020",
                          "https://arxiv.org/abs/2005.14165", "NeurIPS 2020; arXiv:2005.14165"),
    BA_2016: Reference("Jimmy Lei Ba, Jamie Ryan Kiros, Geoffrey E. Hinton", "2016",
                       "https://arxiv.org/abs/1607.06450", "arXiv:1607.06450"),
    HENDRYCKS_2016: Reference("Dan Hendrycks, Kevin Gimpel", "2016",
                              "https://arxiv.org/abs/1606.08415", "arXiv:1606.08415"),
    SENNRICH_2016: Reference("Rico Sennrich, Barry Haddow, Alexandra Birch", "2016",
                             "https://arxiv.org/abs/1508.07909", "ACL 2016; arXiv:1508.07909"),
    LOSHCHILOV_2019: Reference("Ilya Loshchilov, Frank Hutter", "2019",
                               "https://arxiv.org/abs/1711.05101", "ICLR 2019; arXiv:1711.05101"),
    KINGMA_2015: Reference("Diederik P. Kingma, Jimmy Ba", "2015",
                           "https://arxiv.org/abs/1412.6980", "ICLR 2015; arXiv:1412.6980"),
    HOLTZMAN_2020: Reference("Ari Holtzman, Jan Buys, Li Du, Maxwell Forbes, Yejin Choi", "2020",
                             "https://arxiv.org/abs/1904.09751", "ICLR 2020; arXiv:1904.09751"),
    FAN_2018: Reference("Angela Fan, Mike Lewis, Yann Dauphin", "2018",
                        "https://arxiv.org/abs/1805.04833", "ACL 2018; arXiv:1805.04833"),
    HIGHAM_MARY_2019: Reference("Nicholas J. Higham, Theo Mary", "2019",
                                "https://doi.org/10.1137/18M1226312",
                                "SIAM Journal on Scientific Computing 41(5)"),
    KAPLAN_2020: Reference("Jared Kaplan et al. (10 authors)", "2020",
                           "https://arxiv.org/abs/2001.08361", "arXiv:2001.08361"),
    UNICODE_15: Reference("The Unicode Consortium", "September 2022",
                          "https://www.unicode.org/versions/Unicode15.0.0/"),
    MICIKEVICIUS_2018: Reference("Paulius Micikevicius et al. (11 authors)", "2018",
                                 "https://arxiv.org/abs/1710.03740",
                                 "ICLR 2018; arXiv:1710.03740"),
}


@dataclass(frozen=True)
class Source:
    """A citation: a document (or paper) title and where in it."""

    document: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.document}, {self.where}" if self.where else self.document
