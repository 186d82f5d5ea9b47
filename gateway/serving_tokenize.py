"""POST /tokenize and /detokenize (vLLM's extension of the OpenAI API): the
token ids the completion endpoints would send to the dataplane for a prompt
or a conversation, and the text of token ids. No dataplane call but the
model description, which is cached."""

from __future__ import annotations

from gateway.chat_template import ChatTemplateError
from gateway.errors import invalid_request
from gateway.generation import GenerationService, known_token_ids
from gateway.protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse


class TokenizeService:
    def __init__(self, generation: GenerationService) -> None:
        self._generation = generation

    async def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        """Raises APIError 400 (a template that refuses the messages) or 404."""
        model = await self._generation.model_for(body.model)
        tokenizer = model.tokenizer
        if body.messages is not None:
            try:
                text = model.render_prompt([m.for_template() for m in body.messages], body.add_generation_prompt)
            except ChatTemplateError as error:
                raise invalid_request(str(error), param="messages") from error
            # As chat completions: the rendered template holds its own special tokens.
            tokens = tokenizer.encode_prompt(text) if body.add_special_tokens else tokenizer.encode(text)
        else:
            assert body.prompt is not None  # one of the two, by validation
            # As text completions: with the tokenizer's own special tokens (BOS).
            special = body.add_special_tokens is not False
            tokens = tokenizer.encode_prompt(body.prompt) if special else tokenizer.encode(body.prompt)
        return TokenizeResponse(count=len(tokens), max_model_len=model.context_length, tokens=tokens)

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        """Raises APIError 400 for ids the tokenizer does not know, or 404."""
        model = await self._generation.model_for(body.model)
        tokens = known_token_ids(body.tokens, model.tokenizer, "tokens")
        return DetokenizeResponse(prompt=model.tokenizer.decode(tokens))
