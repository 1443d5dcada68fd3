// Benchmark prompt text: a few paragraphs of ordinary English prose (written for this benchmark),
// repeated until the prompt is long enough. Speed does not depend on the token values, but real
// text keeps the greedy continuation (and so the decode-step tokens) realistic.

export const PARAGRAPHS: readonly string[] = [
  "The harbour town woke slowly on winter mornings. Fishing boats came in before dawn, their decks " +
    "stacked with crates of ice and silver fish, and the men who worked them talked in low voices about " +
    "the weather, the price of diesel, and whose nets had torn in the night. By eight o'clock the bakery " +
    "on the corner had sold its first two trays of bread, and the smell of yeast and burnt sugar drifted " +
    "down the hill towards the water.",
  "Maria had kept the lighthouse for eleven years. She knew every sound the old building made: the " +
    "groan of the iron stairs when the temperature dropped, the rattle of the window on the third " +
    "landing, the patient ticking of the clockwork that turned the lamp. Visitors sometimes asked her " +
    "whether she felt lonely. She would smile and say that a person who listens carefully is never " +
    "really alone, and then she would offer them tea.",
  "In the library at the top of the town, a retired engineer was writing a history of the railway " +
    "that had once connected the harbour to the cities inland. He had collected timetables, letters, " +
    "photographs and the wage books of the men who laid the track. Each evening he copied a few pages " +
    "into a notebook in careful handwriting, checking dates against the newspapers of the time and " +
    "marking every doubt with a small pencil cross.",
  "Spring arrived late that year. The storms of March had washed away part of the coastal path, and " +
    "volunteers spent three weekends rebuilding it with stones carried up from the beach. Children " +
    "collected shells and argued about which ones were the most beautiful. When the work was finished, " +
    "the mayor gave a short speech, thanked everyone by name, and announced that the path would be " +
    "named after the lighthouse keeper, who blushed and said nothing at all.",
  "Years later, when people remembered that season, they did not talk about the storms or the " +
    "repairs. They talked about the evening the whole town gathered on the pier to watch the lamp come " +
    "back on after the new lens had been fitted, how the beam swept across the dark water for the first " +
    "time in months, and how, for a moment, nobody said a word.",
];

/** The paragraphs joined and repeated `times` times (blank line between paragraphs). */
export function benchText(times: number): string {
  const block = PARAGRAPHS.join("\n\n");
  return Array.from({ length: times }, () => block).join("\n\n");
}

/**
 * Token ids for at least `minTokens` tokens of benchmark text, using the given tokenizer
 * (node-llama-cpp's `model.tokenize`, so both engines see the same ids).
 */
export function benchTokens(tokenize: (text: string) => readonly number[], minTokens: number): number[] {
  let times = 1;
  for (;;) {
    const ids = tokenize(benchText(times));
    if (ids.length >= minTokens) return ids.slice(0, minTokens);
    // Grow geometrically using the measured tokens per repetition.
    const perRep = Math.max(1, ids.length / times);
    times = Math.max(times + 1, Math.ceil((minTokens / perRep) * 1.05));
  }
}
