//! Cost curves of a simulated engine (vox_serve/sim/cost.py): piecewise-linear `[[x, ms], ...]`
//! per stage, flat below the first point, extending the last segment beyond the last.

use serde_json::Value;

use crate::sched::StepPlan;

#[derive(Debug, Clone)]
pub struct Curve {
    points: Vec<(f64, f64)>,
}

impl Curve {
    pub fn from_json(v: &Value, name: &str) -> Result<Curve, String> {
        let items = v.as_array().ok_or_else(|| format!("costs.{name}: not a list of [x, ms] points"))?;
        let mut points = items.iter().map(|p| -> Result<(f64, f64), String> {
            let pair = p.as_array().filter(|a| a.len() == 2).ok_or_else(|| format!("costs.{name}: a point is not [x, ms]"))?;
            let num = |x: &Value| x.as_f64().ok_or_else(|| format!("costs.{name}: a coordinate is not a number"));
            Ok((num(&pair[0])?, num(&pair[1])?))
        }).collect::<Result<Vec<_>, _>>()?;
        if points.is_empty() {
            return Err(format!("costs.{name}: a cost curve needs at least one point"));
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        Ok(Curve { points })
    }

    pub fn at(&self, x: f64) -> f64 {
        let pts = &self.points;
        if pts.len() == 1 || x <= pts[0].0 {
            return pts[0].1;
        }
        let i = pts.partition_point(|p| p.0 < x).min(pts.len() - 1);
        let ((x0, y0), (x1, y1)) = (pts[i - 1], pts[i]);
        (y0 + (y1 - y0) * (x - x0) / (x1 - x0)).max(0.0)
    }
}

#[derive(Debug, Clone)]
pub struct CostModel {
    decode_ms: Curve,
    prefill_ms: Curve,
    codec_ms: Curve,
    decode_kv_ms_per_1k: f64,
    host_ms_per_step: f64,
    host_ms_per_row: f64,
}

impl CostModel {
    pub fn from_json(costs: &Value) -> Result<CostModel, String> {
        let curve = |name: &str| Curve::from_json(costs.get(name).unwrap_or(&Value::Null), name);
        let host = costs.get("host_ms").cloned().unwrap_or(Value::Null);
        let num = |v: Option<&Value>| v.and_then(Value::as_f64).unwrap_or(0.0);
        Ok(CostModel {
            decode_ms: curve("decode_ms")?,
            prefill_ms: curve("prefill_ms")?,
            codec_ms: curve("codec_ms")?,
            decode_kv_ms_per_1k: num(costs.get("decode_kv_ms_per_1k")),
            host_ms_per_step: num(host.get("per_step")),
            host_ms_per_row: num(host.get("per_row")),
        })
    }

    /// Device seconds of each stage the plan launches, in launch order.
    pub fn stage_seconds(&self, plan: &StepPlan) -> Vec<(&'static str, f64)> {
        let mut out = Vec::new();
        if !plan.codec.is_empty() {
            out.push(("codec", self.codec_ms.at(plan.codec.len() as f64) / 1000.0));
        }
        if !plan.prefill.is_empty() {
            out.push(("prefill", self.prefill_ms.at(plan.prefill.total_tokens() as f64) / 1000.0));
        }
        if !plan.decode.is_empty() {
            let kv: i64 = (0..plan.decode.len()).map(|i| plan.decode.kv_len(i)).sum();
            let ms = self.decode_ms.at(plan.decode.len() as f64) + self.decode_kv_ms_per_1k * kv as f64 / 1000.0;
            out.push(("decode", ms / 1000.0));
        }
        out
    }

    pub fn host_seconds(&self, plan: &StepPlan) -> f64 {
        let rows = (plan.codec.len() + plan.num_lm_rows()) as f64;
        (self.host_ms_per_step + self.host_ms_per_row * rows) / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curves_are_flat_below_interpolated_inside_and_extended_beyond() {
        let c = Curve::from_json(&serde_json::json!([[8, 2.0], [1, 1.0], [16, 4.0]]), "x").unwrap();
        assert_eq!((c.at(0.0), c.at(1.0)), (1.0, 1.0));
        assert!((c.at(4.5) - 1.5).abs() < 1e-12);
        assert!((c.at(12.0) - 3.0).abs() < 1e-12);
        assert!((c.at(32.0) - 8.0).abs() < 1e-12);
    }
}
