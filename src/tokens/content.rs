//! Requests of content blocks (protocol revision 4): Anthropic's Messages
//! shape, and OpenAI's messages with images.
//!
//! A [`Conversation`] is counted in two parts: its text — the system
//! prompt, every text block, tool name, tool input and tool result, the
//! tool definitions — by the limit's own counter, exactly as a
//! [`ChatRequest`] of the same text; and what the provider charges beyond
//! text by its published rules, the same whatever the limit's counter:
//!
//! - **Anthropic images**: `⌈width × height / 750⌉` after the documented
//!   downscaling (long edge at most 1568 px), and never more than 1,600
//!   tokens, the documented most an image can cost; an image of unknown
//!   size (a URL, a file id) costs those 1,600.
//! - **Anthropic tools**: the tool-use system prompt Anthropic adds to a
//!   request with tools, 346 tokens for current models (`tool_choice`
//!   `auto` or `none`; 313 for `any` and `tool`: the larger is reserved).
//! - **OpenAI images**: `detail: "low"` is 85 tokens; otherwise the image is
//!   scaled down to fit 2048 × 2048, then so that its shortest side is at
//!   most 768 px, and costs `85 + 170 × tiles` for its 512 px tiles
//!   (`"auto"` is counted as `"high"`); an image of unknown size costs the
//!   most that rule allows, 8 tiles: 1,445 tokens. Models that count images
//!   by 32 px patches (gpt-4.1-mini, o4-mini, …) cost less: an overestimate.

use super::{Bounds, TokenError};
use crate::proto::{Block, ChatMessage, ChatRequest, Conversation};

/// Whose request shape and image rule a [`Conversation`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Anthropic's Messages API.
    Anthropic,
    /// OpenAI's Chat Completions API.
    Openai,
}

impl Api {
    /// The API of a [`Conversation::api`] name.
    pub fn from_name(name: &str) -> Result<Api, TokenError> {
        match name {
            "anthropic" => Ok(Api::Anthropic),
            "openai" => Ok(Api::Openai),
            other => Err(TokenError::UnknownApi {
                api: other.chars().take(64).collect(),
            }),
        }
    }
}

/// Tokens of Anthropic's tool-use system prompt, added to a request with
/// tools: 346 for current Claude models with `tool_choice` `auto` or `none`
/// (the larger of their two figures).
pub const ANTHROPIC_TOOL_PROMPT_TOKENS: u64 = 346;

/// Longest edge Anthropic sends to the model unscaled.
const ANTHROPIC_MAX_EDGE: u64 = 1568;
/// Most tokens one image costs at Anthropic (larger ones are scaled down).
pub const ANTHROPIC_MAX_IMAGE_TOKENS: u64 = 1600;
/// Pixels per token of Anthropic's image rule.
const ANTHROPIC_PIXELS_PER_TOKEN: u64 = 750;

/// OpenAI's base tokens of an image, and all a `detail: "low"` one costs.
const OPENAI_BASE_TOKENS: u64 = 85;
/// OpenAI's tokens per 512 px tile.
const OPENAI_TILE_TOKENS: u64 = 170;
/// Most tokens one image costs at OpenAI's `high` detail (768 × 2048: 8 tiles).
pub const OPENAI_MAX_IMAGE_TOKENS: u64 = OPENAI_BASE_TOKENS + 8 * OPENAI_TILE_TOKENS;

/// An image's tokens at Anthropic: `⌈w × h / 750⌉` after scaling the long
/// edge down to 1568 px, at most 1,600; 1,600 when the size is unknown
/// (either side 0).
pub fn anthropic_image_tokens(width: u32, height: u32) -> u64 {
    let (mut width, mut height) = (u64::from(width), u64::from(height));
    if width == 0 || height == 0 {
        return ANTHROPIC_MAX_IMAGE_TOKENS;
    }
    let long = width.max(height);
    if long > ANTHROPIC_MAX_EDGE {
        width = (width * ANTHROPIC_MAX_EDGE / long).max(1);
        height = (height * ANTHROPIC_MAX_EDGE / long).max(1);
    }
    (width * height)
        .div_ceil(ANTHROPIC_PIXELS_PER_TOKEN)
        .min(ANTHROPIC_MAX_IMAGE_TOKENS)
}

/// An image's tokens at OpenAI (see the module docs); the most an image
/// can cost when the size is unknown (either side 0).
pub fn openai_image_tokens(width: u32, height: u32, detail: &str) -> u64 {
    if detail.eq_ignore_ascii_case("low") {
        return OPENAI_BASE_TOKENS;
    }
    let (mut width, mut height) = (u64::from(width), u64::from(height));
    if width == 0 || height == 0 {
        return OPENAI_MAX_IMAGE_TOKENS;
    }
    // Fit within 2048 × 2048.
    let long = width.max(height);
    if long > 2048 {
        width = (width * 2048).div_ceil(long);
        height = (height * 2048).div_ceil(long);
    }
    // Shortest side at most 768.
    let short = width.min(height);
    if short > 768 {
        width = (width * 768).div_ceil(short);
        height = (height * 768).div_ceil(short);
    }
    let tiles = width.div_ceil(512) * height.div_ceil(512);
    OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles
}

/// A conversation as the text its limit's counter counts, and the tokens
/// its provider charges beyond that text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The system prompt (a `"system"` message first) and every message's
    /// text blocks, tool calls and tool definitions.
    pub text: ChatRequest,
    /// Images and the tool-use system prompt, by the provider's rules.
    pub fixed_tokens: u64,
}

/// Splits `conversation` into its text and its fixed tokens, or refuses an
/// unknown API or more blocks than [`Bounds::DEFAULT`] counts as parts
/// (images included: the text's own check no longer sees them). Moves the
/// strings; nothing is copied.
pub fn split(conversation: Conversation) -> Result<Split, TokenError> {
    let api = Api::from_name(&conversation.api)?;
    let max_parts = Bounds::DEFAULT.max_parts;
    let blocks = conversation
        .messages
        .iter()
        .try_fold(conversation.system.len(), |sum, turn| {
            Some(sum + turn.blocks.len()).filter(|&sum| sum <= max_parts)
        });
    if blocks.is_none() {
        return Err(TokenError::TooManyParts { max: max_parts });
    }
    let mut fixed_tokens: u64 = 0;
    let mut messages = Vec::with_capacity(conversation.messages.len() + 1);
    if !conversation.system.is_empty() {
        messages.push(ChatMessage {
            role: "system".to_string(),
            name: None,
            content: conversation.system,
            tool_calls_json: None,
        });
    }
    for turn in conversation.messages {
        let mut content = Vec::with_capacity(turn.blocks.len());
        for block in turn.blocks {
            match block {
                Block::Text { text } => content.push(text),
                Block::Image {
                    width,
                    height,
                    detail,
                } => {
                    let tokens = match api {
                        Api::Anthropic => anthropic_image_tokens(width, height),
                        Api::Openai => openai_image_tokens(width, height, &detail),
                    };
                    fixed_tokens = fixed_tokens.saturating_add(tokens);
                }
            }
        }
        messages.push(ChatMessage {
            role: turn.role,
            name: turn.name,
            content,
            tool_calls_json: turn.tool_calls_json,
        });
    }
    let has_tools = conversation
        .tools_json
        .as_deref()
        .is_some_and(|tools| !matches!(tools.trim(), "" | "[]" | "null"));
    if api == Api::Anthropic && has_tools {
        fixed_tokens = fixed_tokens.saturating_add(ANTHROPIC_TOOL_PROMPT_TOKENS);
    }
    Ok(Split {
        text: ChatRequest {
            messages,
            tools_json: conversation.tools_json,
            max_output_tokens: conversation.max_output_tokens,
        },
        fixed_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Turn;

    #[test]
    fn anthropic_images_by_the_documented_table() {
        // Anthropic's vision guide: "~54", "~1334" and "~1590" tokens for
        // 200², 1000² and 1092² px; the largest unscaled sizes per aspect
        // ratio all stay within 1,600.
        let cases = [
            ((200, 200), 54),
            ((1000, 1000), 1334),
            ((1092, 1092), 1590),
            // 1608, 1606 and 1640 by the formula: the ceiling holds.
            ((951, 1268), 1600),
            ((896, 1344), 1600),
            ((819, 1456), 1590),
            ((784, 1568), 1600),
            // Scaled down to 1568 × 1045 (2185), then the ceiling.
            ((3000, 2000), 1600),
            // Long and thin: scaled to 1568 × 98.
            ((8000, 500), 205),
            ((0, 0), 1600),
            ((1, 1), 1),
        ];
        for ((width, height), tokens) in cases {
            assert_eq!(
                anthropic_image_tokens(width, height),
                tokens,
                "{width}×{height}"
            );
        }
    }

    #[test]
    fn openai_images_by_the_documented_examples() {
        // OpenAI's vision guide: 1024² high → 768² → 4 tiles → 765;
        // 2048×4096 high → 1024×2048 → 768×1536 → 6 tiles → 1105;
        // 4096×8192 low → 85.
        let cases = [
            ((1024, 1024, "high"), 765),
            ((2048, 4096, "high"), 1105),
            ((4096, 8192, "low"), 85),
            ((2048, 4096, "auto"), 1105),
            ((2048, 4096, ""), 1105),
            ((512, 512, "high"), 255),
            ((100, 100, "high"), 255),
            ((0, 0, "high"), 1445),
            ((0, 0, "low"), 85),
        ];
        for ((width, height, detail), tokens) in cases {
            assert_eq!(
                openai_image_tokens(width, height, detail),
                tokens,
                "{width}×{height} {detail}"
            );
        }
    }

    fn text(text: &str) -> Block {
        Block::Text { text: text.into() }
    }

    #[test]
    fn split_moves_text_and_prices_images_and_tools() {
        let conversation = Conversation {
            api: "anthropic".into(),
            system: vec!["Be brief.".into(), "Cite.".into()],
            messages: vec![Turn {
                role: "user".into(),
                name: None,
                blocks: vec![
                    text("What is this?"),
                    Block::Image {
                        width: 1000,
                        height: 1000,
                        detail: String::new(),
                    },
                ],
                tool_calls_json: None,
            }],
            tools_json: Some(r#"[{"name":"get_weather"}]"#.into()),
            max_output_tokens: Some(100),
        };
        let split = split(conversation.clone()).unwrap();
        assert_eq!(split.fixed_tokens, 1334 + ANTHROPIC_TOOL_PROMPT_TOKENS);
        assert_eq!(
            split.text,
            ChatRequest {
                messages: vec![
                    ChatMessage::text("system", &["Be brief.", "Cite."]),
                    ChatMessage::text("user", &["What is this?"]),
                ],
                tools_json: conversation.tools_json.clone(),
                max_output_tokens: Some(100),
            }
        );
        // The same image by OpenAI's rule, and no tool prompt.
        let openai = Conversation {
            api: "openai".into(),
            system: Vec::new(),
            ..conversation.clone()
        };
        assert_eq!(super::split(openai).unwrap().fixed_tokens, 765);
        let unknown = Conversation {
            api: "gemini".into(),
            ..conversation
        };
        assert_eq!(
            super::split(unknown).unwrap_err(),
            TokenError::UnknownApi {
                api: "gemini".into()
            }
        );
    }
}
