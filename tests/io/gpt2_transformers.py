#!/usr/bin/env python3
"""The logits Hugging Face's own transformers.GPT2LMHeadModel gives for a token sequence, loaded
from a folder with from_pretrained (what users of an export run).

  gpt2_transformers.py DIR TOKEN...   prints the logits as a JSON list of rows (the last line)
"""
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its notices would go to stdout too
import torch
from transformers import GPT2LMHeadModel

model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
with torch.no_grad():
    logits = model(torch.tensor([[int(t) for t in sys.argv[2:]]])).logits[0]
print(json.dumps(logits.float().tolist()))
