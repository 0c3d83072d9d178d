//! An image's size in pixels read from its first bytes (PNG, JPEG, GIF,
//! WebP), as the Python client reads it (`_content.image_size`) from a
//! base64 image in a request: an image whose size is not read is sent as
//! 0 × 0, which the daemon prices as the most an image can cost.

/// Characters of a base64 image decoded to find its size: the client's
/// `_SNIFF_BYTES * 4 // 3 // 4 * 4` (256 KiB of image; the JPEG frame header
/// may follow EXIF data).
const SNIFF_CHARS: usize = 256 * 1024 * 4 / 3 / 4 * 4;

/// The size of a base64 image, or (0, 0) when it cannot be read.
pub(crate) fn base64_image_size(text: &str) -> (u32, u32) {
    let head: String = text.chars().take(SNIFF_CHARS).collect();
    let Some(data) = decode_base64(&head) else {
        return (0, 0);
    };
    match image_size(&data) {
        Some((width, height)) if width > 0 && height > 0 => (width, height),
        _ => (0, 0),
    }
}

/// The size of a `data:...;base64,` URL's image; (0, 0) for any other URL.
pub(crate) fn data_url_size(url: &str) -> (u32, u32) {
    if !url.starts_with("data:") {
        return (0, 0);
    }
    let (header, data) = url.split_once(',').unwrap_or((url, ""));
    if !header.ends_with(";base64") {
        return (0, 0);
    }
    base64_image_size(data)
}

/// Python's `base64.b64decode(text)` (not strict): only ASCII is accepted;
/// characters outside the alphabet are skipped; a pad ends the data once a
/// quad has two characters; an unfinished quad is an error.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    if !text.is_ascii() {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut quad_pos, mut pads, mut left) = (0u32, 0u32, 0u32);
    for &c in text.as_bytes() {
        if c == b'=' {
            if quad_pos >= 2 {
                pads += 1;
                if quad_pos + pads >= 4 {
                    return Some(out);
                }
            }
            continue;
        }
        let Some(v) = value(c) else { continue };
        pads = 0;
        match quad_pos {
            0 => {
                quad_pos = 1;
                left = v;
            }
            1 => {
                quad_pos = 2;
                out.push(((left << 2) | (v >> 4)) as u8);
                left = v & 0x0f;
            }
            2 => {
                quad_pos = 3;
                out.push(((left << 4) | (v >> 2)) as u8);
                left = v & 0x03;
            }
            _ => {
                quad_pos = 0;
                out.push(((left << 6) | v) as u8);
                left = 0;
            }
        }
    }
    (quad_pos == 0).then_some(out)
}

/// `data[from..to]`, shorter (or empty) where the data ends, as a Python slice.
fn slice(data: &[u8], from: usize, to: usize) -> &[u8] {
    let end = to.min(data.len());
    if from >= end { &[] } else { &data[from..end] }
}

fn be16(bytes: &[u8]) -> Option<u32> {
    let bytes: [u8; 2] = bytes.try_into().ok()?;
    Some(u16::from_be_bytes(bytes).into())
}

fn le16(bytes: &[u8]) -> Option<u32> {
    let bytes: [u8; 2] = bytes.try_into().ok()?;
    Some(u16::from_le_bytes(bytes).into())
}

fn le_int(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .rev()
        .fold(0u32, |value, &byte| (value << 8) | u32::from(byte))
}

/// (width, height) in pixels of a PNG, JPEG, GIF or WebP image; `None` if
/// not known.
fn image_size(data: &[u8]) -> Option<(u32, u32)> {
    if slice(data, 0, 8) == b"\x89PNG\r\n\x1a\n" && slice(data, 12, 16) == b"IHDR" {
        let width: [u8; 4] = slice(data, 16, 20).try_into().ok()?;
        let height: [u8; 4] = slice(data, 20, 24).try_into().ok()?;
        return Some((u32::from_be_bytes(width), u32::from_be_bytes(height)));
    }
    if matches!(slice(data, 0, 6), b"GIF87a" | b"GIF89a") && data.len() >= 10 {
        return Some((le16(&data[6..8])?, le16(&data[8..10])?));
    }
    if slice(data, 0, 4) == b"RIFF" && slice(data, 8, 12) == b"WEBP" {
        return webp_size(data);
    }
    if slice(data, 0, 2) == b"\xff\xd8" {
        return jpeg_size(data);
    }
    None
}

fn webp_size(data: &[u8]) -> Option<(u32, u32)> {
    let chunk = slice(data, 12, 16);
    if chunk == b"VP8X" && data.len() >= 30 {
        return Some((le_int(&data[24..27]) + 1, le_int(&data[27..30]) + 1));
    }
    if chunk == b"VP8L" && data.len() >= 25 {
        let bits = le_int(&data[21..25]);
        return Some(((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1));
    }
    if chunk == b"VP8 " && data.len() >= 30 {
        return Some((le16(&data[26..28])? & 0x3FFF, le16(&data[28..30])? & 0x3FFF));
    }
    None
}

fn jpeg_size(data: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    while at + 9 <= data.len() {
        if data[at] != 0xFF {
            return None;
        }
        let marker = data[at + 1];
        if matches!(marker, 0xD8 | 0x01 | 0xD0..=0xD7 | 0xFF) {
            at += if marker == 0xFF { 1 } else { 2 };
            continue;
        }
        let length = be16(&data[at + 2..at + 4])? as usize;
        // Start-of-frame markers (not DHT C4, JPG C8, DAC CC) hold the size.
        if (0xC0..=0xCF).contains(&marker) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) {
            let height = be16(&data[at + 5..at + 7])?;
            let width = be16(&data[at + 7..at + 9])?;
            return Some((width, height));
        }
        at += 2 + length;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Base64 of the first bytes of a 640 × 480 PNG.
    const PNG_640X480: &str = "iVBORw0KGgoAAAANSUhEUgAAAoAAAAHgCAIAAAA=";

    #[test]
    fn sizes_of_base64_images() {
        assert_eq!(base64_image_size(PNG_640X480), (640, 480));
        assert_eq!(
            data_url_size(&format!("data:image/png;base64,{PNG_640X480}")),
            (640, 480)
        );
        // Not base64, not an image, unfinished, not a data URL: unknown.
        assert_eq!(base64_image_size("é"), (0, 0));
        assert_eq!(base64_image_size("aGVsbG8gd29ybGQh"), (0, 0));
        assert_eq!(base64_image_size("iVBORw0KG"), (0, 0));
        assert_eq!(data_url_size("https://example.com/cat.png"), (0, 0));
        // Characters outside the alphabet are skipped, as Python does.
        let wrapped = format!("{}\n{}", &PNG_640X480[..20], &PNG_640X480[20..]);
        assert_eq!(base64_image_size(&wrapped), (640, 480));
    }

    #[test]
    fn gif_webp_and_jpeg_headers() {
        assert_eq!(image_size(b"GIF89a\x20\x03\x58\x02"), Some((800, 600)));
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00];
        jpeg.extend([0xFF, 0xC0, 0x00, 0x11, 0x08, 0x01, 0xE0, 0x02, 0x80]);
        assert_eq!(image_size(&jpeg), Some((640, 480)));
        let mut webp = b"RIFF\0\0\0\0WEBPVP8X".to_vec();
        webp.extend([0u8; 8]);
        webp.extend([0x7F, 0x02, 0x00, 0xDF, 0x01, 0x00]);
        assert_eq!(image_size(&webp), Some((640, 480)));
    }
}
