/**
 * A JSON reader that keeps every integer exact, as a `bigint` (PROTOCOL.md §11:
 * the vectors hold u64 and i64 values beyond `Number.MAX_SAFE_INTEGER`).
 */
export type Json = null | boolean | bigint | number | string | Json[] | { [key: string]: Json };

export function parseJson(text: string): Json {
  let at = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at offset ${at}`);
  };
  const space = (): void => {
    while (at < text.length && " \t\r\n".includes(text[at] as string)) at++;
  };
  const value = (): Json => {
    space();
    const char = text[at];
    if (char === "{") {
      at++;
      const object: { [key: string]: Json } = {};
      space();
      if (text[at] === "}") {
        at++;
        return object;
      }
      for (;;) {
        space();
        const key = value();
        if (typeof key !== "string") fail("object key expected");
        space();
        if (text[at++] !== ":") fail("':' expected");
        object[key as string] = value();
        space();
        const next = text[at++];
        if (next === "}") return object;
        if (next !== ",") fail("',' or '}' expected");
      }
    }
    if (char === "[") {
      at++;
      const array: Json[] = [];
      space();
      if (text[at] === "]") {
        at++;
        return array;
      }
      for (;;) {
        array.push(value());
        space();
        const next = text[at++];
        if (next === "]") return array;
        if (next !== ",") fail("',' or ']' expected");
      }
    }
    if (char === '"') {
      const match = /^"(?:[^"\\]|\\.)*"/s.exec(text.slice(at));
      if (match === null) return fail("unterminated string");
      at += match[0].length;
      return JSON.parse(match[0]) as string;
    }
    const literal = /^(?:true|false|null|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/.exec(text.slice(at));
    if (literal === null) return fail("value expected");
    at += literal[0].length;
    const word = literal[0];
    if (word === "true") return true;
    if (word === "false") return false;
    if (word === "null") return null;
    return /^-?\d+$/.test(word) ? BigInt(word) : Number(word);
  };
  const result = value();
  space();
  if (at !== text.length) fail("trailing text");
  return result;
}
