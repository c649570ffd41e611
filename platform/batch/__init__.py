"""OpenAI's Batch API: tenant-owned JSONL files, batch jobs persisted in SQL and the blob store, and a runner
per replica that runs their lines through the generation routes' own code path at background priority."""
