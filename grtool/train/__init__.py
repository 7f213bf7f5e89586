"""`grtool train sft|kto`: SFT and KTO on TRL over the files `export sft` / `export kto` write."""
