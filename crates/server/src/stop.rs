//! Stop strings over streamed text. Text that could still become a stop
//! string is held back, so a stream never shows part of a stop string that
//! a non-streamed answer would have cut.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would stop before the first token).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds a decoded piece; returns the text now safe to show, and whether
    /// a stop string was found (the text before it is all that is shown).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // The longest tail of the held text that starts some stop string stays held.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| s.char_indices().skip(1).map(move |(k, _)| &s[..k]))
            .filter(|prefix| self.held.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// The held text, when generation ends without a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            out.push(t);
            if hit {
                return (out, true, String::new());
            }
        }
        (out, false, m.finish())
    }

    #[test]
    fn a_stop_across_pieces_is_cut_and_never_shown() {
        let (out, hit, _) = run(&["\nUser:"], &["Amen", ".\nU", "se", "r: hi"]);
        assert!(hit);
        assert_eq!(out, ["Amen", ".", "", ""]);
    }

    #[test]
    fn a_false_start_is_released() {
        let (out, hit, rest) = run(&["END"], &["the E", "ND", "x"]);
        assert!(hit);
        assert_eq!(out.concat(), "the ");
        assert!(rest.is_empty());
        let (out, hit, rest) = run(&["END"], &["the E", "nd", "E"]);
        assert!(!hit);
        assert_eq!(out.concat() + &rest, "the EndE");
        assert_eq!(rest, "E");
    }

    #[test]
    fn multibyte_prefixes_and_empty_stops() {
        let (out, hit, rest) = run(&["", "é!"], &["caf", "é", "?"]);
        assert!(!hit);
        assert_eq!(out, ["caf", "", "é?"]);
        assert!(rest.is_empty());
        let (out, hit, _) = run(&["b", "ab"], &["xab"]);
        assert!(hit);
        assert_eq!(out, ["x"], "the earliest stop wins");
    }
}
