# Used by Fly (fly.toml). The CPU build of torch keeps the image small enough for the
# offline embedding model; set ARXIVSCOUT_EMBEDDINGS=openai to skip it.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY app app
COPY bot bot
COPY memory memory
COPY adapters adapters
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install --no-cache-dir '.[local]'
ENV PORT=8080
# what the bot prints reaches `fly logs` when printed, not when a buffer fills
ENV PYTHONUNBUFFERED=1
CMD ["arxivscout", "slack"]
