"""The instrumentation example the "Get started" page shows (executed as written by the tests).

Names the engine provides: ``target_model`` / ``draft_model`` (torch modules), ``aux_ids`` (the
target layers whose input hidden states feed the draft), ``k`` (draft tokens per verify step),
``checkpoint`` (the draft's ``.safetensors`` file) and the serving loop's plain values: ``prompt_len``,
``accepted`` and ``output_len`` (token counts), ``step_texts`` (the step's emitted tokens decoded, a
list of str) and ``text`` (the request's output). README.md shows the same code; a test keeps them
equal and runs it on real torch modules.
"""

SNIPPET = '''\
from specscope import Collector, RunConfig, Tracer, check_load, instrument
from specscope.readmodel import store_verdict

# The contract between target and draft: n capture layers x target hidden size = fc input width.
hidden = target_model.config.hidden_size
config = RunConfig(aux_layer_ids_resolved=tuple(aux_ids), target_hidden_size=hidden,
                   expected_fused_width=len(aux_ids) * hidden, k=k,
                   num_target_layers=target_model.config.num_hidden_layers)
collector = Collector("specscope.db", on_run_end=store_verdict)  # or "postgresql+psycopg://user@host/db"
tracer = Tracer(collector, engine="my-engine", engine_version="1.0", target_model="my-target",
                draft_model="my-eagle3-draft", config=config,
                provenance_every=16)  # every 16th target-fed draft call: which layers it received
instrument(tracer, draft=draft_model, target=target_model)  # draft input + capture layers
check_load(tracer, draft_model, checkpoint)  # keys the loader drops, misses or renames

# In the serving loop, plain Python values the engine already holds (never tensors):
tracer.start_request("req-0", prompt_tokens=prompt_len)
tracer.record_verify("req-0", proposed=k, accepted=accepted,
                     emitted=step_texts)  # optional: the step's tokens as str (or emitted_ids=, decoded by
tracer.finish_request("req-0", output_tokens=output_len, text=text)  # Collector(tokenizer=) off-thread)
tracer.close(); collector.close()  # removes every hook, flushes
'''
