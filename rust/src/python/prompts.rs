//! Python bindings of the tokenizer and the prompt builders (used by tests to compare them with
//! the Python builders and HF tokenizers; the Rust runtime calls them directly).

use std::path::Path;
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyLong, PyString, PyTuple};
use serde_json::Value;

use crate::models::orpheus::OrpheusPrompt;
use crate::models::qwen3_tts::{PromptIds, Qwen3Prompt};
use crate::models::{self, PromptBuilder, PromptError};
use crate::tokenizer::{self, Tokenizer};

fn value_err(e: String) -> PyErr {
    PyValueError::new_err(e)
}

fn prompt_err(e: PromptError) -> PyErr {
    PyValueError::new_err(e.message)
}

#[pyclass(name = "Tokenizer")]
#[derive(Clone)]
pub struct PyTokenizer {
    pub inner: Arc<Tokenizer>,
}

#[pymethods]
impl PyTokenizer {
    /// A tokenizer from a `tokenizer.json` file.
    #[staticmethod]
    fn from_file(py: Python, path: &str) -> PyResult<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| value_err(format!("{path}: {e}")))?;
        let inner = py.allow_threads(|| tokenizer::from_json(&text)).map_err(|e| value_err(format!("{path}: {e}")))?;
        Ok(PyTokenizer { inner: Arc::new(inner) })
    }

    /// A tokenizer from the text of a `tokenizer.json`.
    #[staticmethod]
    fn from_str(py: Python, json: &str) -> PyResult<Self> {
        let inner = py.allow_threads(|| tokenizer::from_json(json)).map_err(value_err)?;
        Ok(PyTokenizer { inner: Arc::new(inner) })
    }

    /// A Qwen2 tokenizer from a directory's `vocab.json`, `merges.txt` and `tokenizer_config.json`.
    #[staticmethod]
    fn from_qwen2_files(py: Python, directory: &str) -> PyResult<Self> {
        let inner = py.allow_threads(|| tokenizer::from_qwen2_files(Path::new(directory))).map_err(value_err)?;
        Ok(PyTokenizer { inner: Arc::new(inner) })
    }

    #[args(add_special_tokens = "true")]
    fn encode(&self, py: Python, text: &str, add_special_tokens: bool) -> Vec<u32> {
        py.allow_threads(|| self.inner.encode(text, add_special_tokens))
    }

    /// (ids, word ids, char offsets), as HF's `Encoding.ids`, `.word_ids`, `.offsets`.
    #[args(add_special_tokens = "true")]
    #[allow(clippy::type_complexity)]
    fn encode_full(&self, py: Python, text: &str, add_special_tokens: bool
                   ) -> (Vec<u32>, Vec<Option<u32>>, Vec<(usize, usize)>) {
        let enc = py.allow_threads(|| self.inner.encode_full(text, add_special_tokens));
        (enc.ids, enc.word_ids, enc.offsets)
    }

    /// `encode_full` of a request's text as prompts read it: special-token strings stay text (HF's
    /// `encode_special_tokens = True`), the template applies.
    #[allow(clippy::type_complexity)]
    fn encode_user_text(&self, py: Python, text: &str) -> (Vec<u32>, Vec<Option<u32>>, Vec<(usize, usize)>) {
        let enc = py.allow_threads(|| self.inner.encode_user_text(text));
        (enc.ids, enc.word_ids, enc.offsets)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
}

/// Request fields (a dict of JSON-like values) as JSON. Binary uploads (reference audio) only
/// matter to prompt building as present or absent, so bytes become `true` / null.
fn to_json(obj: &PyAny) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.downcast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.downcast::<PyLong>().is_ok() {
        return Ok(Value::from(obj.extract::<i64>()?));
    }
    if obj.downcast::<PyFloat>().is_ok() {
        return Ok(serde_json::Number::from_f64(obj.extract::<f64>()?).map_or(Value::Null, Value::Number));
    }
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_string()));
    }
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(if b.as_bytes().is_empty() { Value::Null } else { Value::Bool(true) });
    }
    if let Ok(d) = obj.downcast::<PyDict>() {
        let mut map = serde_json::Map::new();
        for (k, v) in d.iter() {
            map.insert(k.extract::<String>()?, to_json(v)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.downcast::<PyList>().is_ok() || obj.downcast::<PyTuple>().is_ok() {
        let items: Vec<&PyAny> = obj.extract()?;
        return Ok(Value::Array(items.into_iter().map(to_json).collect::<PyResult<_>>()?));
    }
    Err(PyTypeError::new_err(format!("fields: {} values are not supported", obj.get_type().name()?)))
}

#[pyclass(name = "PromptBuilder")]
pub struct PyPromptBuilder {
    inner: PromptBuilder,
}

#[pymethods]
impl PyPromptBuilder {
    /// Orpheus: the tokenizer, the voices and the default voice (the program's meta).
    #[staticmethod]
    fn orpheus(tokenizer: &PyTokenizer, voices: Vec<String>, default_voice: String) -> Self {
        let prompt = OrpheusPrompt { tokenizer: tokenizer.inner.clone(), voices, default_voice };
        PyPromptBuilder { inner: PromptBuilder::Orpheus(prompt) }
    }

    /// Qwen3-TTS: the tokenizer and the text of the checkpoint's `config.json`.
    #[staticmethod]
    fn qwen3_tts(tokenizer: &PyTokenizer, config_json: &str) -> PyResult<Self> {
        let cfg: Value = serde_json::from_str(config_json).map_err(|e| value_err(format!("config.json: {e}")))?;
        let ids = PromptIds::from_config(&cfg).map_err(value_err)?;
        Ok(PyPromptBuilder { inner: PromptBuilder::Qwen3(Qwen3Prompt { tokenizer: tokenizer.inner.clone(), ids }) })
    }

    /// The prompt rows of a request's fields (what the program's `preprocess` returns).
    fn build(&self, py: Python, fields: &PyAny) -> PyResult<Vec<Vec<i64>>> {
        let fields = to_json(fields)?;
        py.allow_threads(|| self.inner.build(&fields)).map_err(prompt_err)
    }

    /// (rows, trailing text ids) of a request's fields: the program's `preprocess` prompt and its
    /// `trailing_text` (Qwen3-TTS's streaming-text layout, `non_streaming_mode` false; else empty).
    fn build_with_trailing(&self, py: Python, fields: &PyAny) -> PyResult<(Vec<Vec<i64>>, Vec<i64>)> {
        let fields = to_json(fields)?;
        py.allow_threads(|| self.inner.build_with_trailing(&fields)).map_err(prompt_err)
    }

    /// A voice clone's (rows, speaker row) given the reference codes (None: x-vector only).
    fn build_clone(&self, py: Python, fields: &PyAny, ref_codes: Option<Vec<Vec<i64>>>) -> PyResult<(Vec<Vec<i64>>, usize)> {
        let fields = to_json(fields)?;
        py.allow_threads(|| self.inner.build_clone(&fields, ref_codes.as_deref())).map_err(prompt_err)
    }

    /// Whether a Base request clones in x-vector-only mode (else in context); ValueError for
    /// fields a clone cannot take.
    fn clone_mode(&self, fields: &PyAny) -> PyResult<bool> {
        models::clone_mode(&to_json(fields)?).map_err(prompt_err)
    }

    /// Input streaming: (stable text ids, end) of `text[start:]`.
    fn stable_text_ids(&self, py: Python, text: &str, start: usize, ended: bool) -> PyResult<(Vec<i64>, usize)> {
        py.allow_threads(|| self.inner.stable_text_ids(text, start, ended)).map_err(prompt_err)
    }

    /// Input streaming: the prompt rows (and, for a clone, the speaker row) given the first text id.
    fn streaming_prompt(&self, py: Python, fields: &PyAny, first_text_id: i64) -> PyResult<(Vec<Vec<i64>>, Option<usize>)> {
        let fields = to_json(fields)?;
        py.allow_threads(|| self.inner.streaming_prompt(&fields, first_text_id)).map_err(prompt_err)
    }
}

/// `builder.build(fields)`.
#[pyfunction]
fn build_prompt(py: Python, builder: &PyPromptBuilder, fields: &PyAny) -> PyResult<Vec<Vec<i64>>> {
    builder.build(py, fields)
}

#[pyfunction]
fn nfc(text: &str) -> String {
    tokenizer::unicode::nfc_aligned(text, 0).into_iter().map(|a| a.c).collect()
}

pub fn register(m: &PyModule) -> PyResult<()> {
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyPromptBuilder>()?;
    m.add_function(wrap_pyfunction!(build_prompt, m)?)?;
    m.add_function(wrap_pyfunction!(nfc, m)?)?;
    m.add("UNICODE_VERSION", tokenizer::UNICODE_VERSION)?;
    Ok(())
}
