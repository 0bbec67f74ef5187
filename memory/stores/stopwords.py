"""Words the knowledge base neither indexes nor searches for.

PubMed's stopword list (the one NCBI applies to scientific literature search: function words
and the verbs every paper uses, "using", "shown", "however"), the pronouns it leaves out, and
the words people use to
ask an assistant for something ("explain", "compare", "papers") rather than to name a topic.
They match a large share of all passages, so a query that keeps them walks long posting lists
for terms that barely change the ranking; the vector half still reads the whole question.
"""

from __future__ import annotations

PUBMED = """
a about again all almost also although always among an and another any are as at be because
been before being between both but by can could did do does done due during each either
enough especially etc for found from further had has have having here how however i if in into
is it its itself just kg km made mainly make may mg might ml mm most mostly must nearly neither
no nor obtained of often on our overall perhaps pmid quite rather really regarding seem seen
several should show showed shown shows significantly since so some such than that the their
theirs them then there therefore these they this those through thus to upon use used using
various very was we were what when which while with within without would
"""

FUNCTION_WORDS = "he she his her him me my you your who whom why where will not or"

REQUESTS = """
please tell give get find show list explain describe summarize summarise compare discuss say
says know paper papers article articles literature
"""

STOPWORDS = frozenset(f"{PUBMED} {FUNCTION_WORDS} {REQUESTS}".split())
