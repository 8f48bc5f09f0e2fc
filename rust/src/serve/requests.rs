//! Requests as plain data (vox_serve/rust_host.py `_request_data`) into scheduler requests.

use serde_json::Value;

use crate::sched::config::{boolean, float, get, int, string};
use crate::sched::types::{Conditioning, Prompt, Request, SamplingParams, TextFeed};

fn floats(v: &Value, what: &str) -> Result<Vec<f32>, String> {
    v.as_array().ok_or(format!("{what} is not a list"))?.iter()
        .map(|x| x.as_f64().map(|x| x as f32).ok_or(format!("{what} holds a non-number"))).collect()
}

fn sampling(s: &Value) -> Result<SamplingParams, String> {
    let p = "sampling.";
    Ok(SamplingParams {
        temperature: float(s, p, "temperature")?, top_k: int(s, p, "top_k")?, top_p: float(s, p, "top_p")?,
        min_p: float(s, p, "min_p")?, repetition_penalty: float(s, p, "repetition_penalty")?,
        repetition_window: int(s, p, "repetition_window")?, max_tokens: int(s, p, "max_tokens")?,
        ignore_eos: boolean(s, p, "ignore_eos")?, seed: int(s, p, "seed")?,
    })
}

pub fn request(r: &Value) -> Result<Request, String> {
    let p = "request.";
    let rows = get(r, p, "ids")?.as_array().ok_or("request.ids is not a list")?.iter()
        .map(|row| row.as_array().ok_or("request.ids holds a non-list")?.iter()
            .map(|id| id.as_i64().ok_or("request.ids holds a non-integer")).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()?;
    let mut prompt = Prompt::from_rows(&rows)?;
    for v in get(r, p, "vectors")?.as_array().ok_or("request.vectors is not a list")? {
        let pos = v.get(0).and_then(Value::as_u64).ok_or("request.vectors[][0] is not a position")? as usize;
        prompt.vectors.push((pos, floats(v.get(1).unwrap_or(&Value::Null), "request.vectors[][1]")?));
    }
    for c in get(r, p, "conditioning")?.as_array().ok_or("request.conditioning is not a list")? {
        let name = c.get(0).and_then(Value::as_str).ok_or("request.conditioning[][0] is not a name")?;
        let rows = c.get(1).and_then(Value::as_u64).ok_or("request.conditioning[][1] is not a size")? as usize;
        let values = floats(c.get(2).unwrap_or(&Value::Null), "request.conditioning[][2]")?;
        prompt.conditioning.push(Conditioning { name: name.to_string(), rows, values });
    }
    let streaming = r.get("streaming").and_then(Value::as_bool).unwrap_or(true);
    let mut req = Request::new(string(r, p, "req_id")?, prompt, sampling(get(r, p, "sampling")?)?, streaming);
    req.text_feed = trailing_text(r)?;
    Ok(req)
}

/// A prompt's trailing text ids (`Prompt.trailing_text`: one per generated row, for a model with a
/// streamed text column) as the text feed of a request whose text has ended (request_builder.py
/// `new_request`); none without them.
fn trailing_text(r: &Value) -> Result<Option<TextFeed>, String> {
    let ids = match r.get("trailing_text") {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v.as_array().ok_or("request.trailing_text is not a list")?,
    };
    let ids = ids.iter().map(|id| id.as_i64().ok_or("request.trailing_text holds a non-id"))
        .collect::<Result<Vec<_>, _>>()?;
    ended_feed(&ids)
}

/// The text feed of trailing text ids (none without them): all there is, so it has ended.
pub fn ended_feed(ids: &[i64]) -> Result<Option<TextFeed>, String> {
    if ids.is_empty() {
        return Ok(None);
    }
    let ids = ids.iter().map(|&id| i32::try_from(id).map_err(|_| format!("text id {id} does not fit in int32")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(TextFeed { ids, ended: true }))
}
