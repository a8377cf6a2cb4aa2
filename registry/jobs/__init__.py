"""Asynchronous inference jobs: batch jobs over a stored input file, and single infer-async requests.

A job is a row (``registry.models.InferenceJob``) with its version fixed when it is accepted, and the
rows ``[start, stop)`` it is split into (``InferenceJobChunk``). The store holds everything else, under
``inference-jobs/<public_id>/``: the input, each chunk's input and output, and the result.

The life of a batch job (``services.py``):

1. ``job_submit`` checks the format, the limits (rows, bytes, queued per token and in all, each refusal
   naming its setting) and the input itself, streaming an uploaded input to the store as it is read (and
   to a local work file, which is inspected: ``formats.py``); an ``input_url`` names a key of the
   configured store. It records the job ``queued`` with the ``inference_job.submit`` audit event, and
   queues the task ``prepare_inference_job`` after commit.
2. ``job_prepare`` (the task) splits the input into chunk files of ``MODELYARD_INFERENCE_JOB_CHUNK_ROWS``
   rows, then writes the chunk rows and the job's ``rows`` in one transaction.
3. Inference processes take chunks through ``registry.serving`` (``chunks.py``: ``job_chunk_claim`` is a
   conditional update, so a chunk is taken once; the claim is a lease, renewed by ``job_chunk_progress``;
   a lapsed lease is taken again, up to ``MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS`` attempts). The first
   claim moves the job to ``running``; the last chunk done queues ``finish_inference_job``.
4. ``job_finish`` (the task) assembles the result from the chunk outputs, one chunk in memory at a time,
   and ends the job ``succeeded`` with ``inference_job.finish`` and the ``inference_job.finished`` webhook
   event in one transaction. A failure or a cancel ends it the same way.

An infer-async request (``request_submit``) is a job of one row and one chunk, recorded with its chunk at
once; its answer is the chunk's output, kept ``MODELYARD_ASYNC_RESULT_TTL_SECONDS``.

``InferenceJob.expires_at`` does two things. While a batch job's registry-side step (preparing, or
finishing) runs, it is that step's lease: a task takes the step with a conditional update that sets it,
so a second delivery does nothing, and the periodic sweep (``jobs_sweep``) queues the step again once
it lapses (its worker was lost). Once the job has ended, it is when its stored objects go: the sweep
then deletes them (and an infer-async job's row). ``InferenceJob.parameters`` of a batch job holds its
options: ``{"outputs": [...], "result_format": "npz"|"jsonl", "parameters": {...}}``.
"""
